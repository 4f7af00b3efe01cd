"""Checkpoints: orbax training checkpoints (and, later, the official .npz layout)."""

from vit_jax.checkpoint.train_ckpt import Checkpointer

__all__ = ['Checkpointer']
