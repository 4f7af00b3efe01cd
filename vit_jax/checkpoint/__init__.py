"""Checkpoints: orbax training checkpoints and the official .npz layout (`npz`)."""

from vit_jax.checkpoint.npz import check_params
from vit_jax.checkpoint.npz import load_for_model
from vit_jax.checkpoint.npz import load_npz
from vit_jax.checkpoint.npz import read_npz
from vit_jax.checkpoint.npz import save_npz
from vit_jax.checkpoint.train_ckpt import Checkpointer

__all__ = ['Checkpointer', 'check_params', 'load_for_model', 'load_npz', 'read_npz', 'save_npz']
