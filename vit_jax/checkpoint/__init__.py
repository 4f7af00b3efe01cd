"""Checkpoints: orbax training checkpoints, the official .npz layout (`npz`), timm state dicts and
.safetensors files (`timm_layout`), model descriptions (`spec`) and inference bundles (`bundle`)."""

from vit_jax.checkpoint.npz import check_params
from vit_jax.checkpoint.npz import load_for_model
from vit_jax.checkpoint.npz import load_npz
from vit_jax.checkpoint.npz import read_npz
from vit_jax.checkpoint.npz import save_npz
from vit_jax.checkpoint.spec import ModelSpec
from vit_jax.checkpoint.timm_layout import from_timm
from vit_jax.checkpoint.timm_layout import load_safetensors
from vit_jax.checkpoint.timm_layout import save_safetensors
from vit_jax.checkpoint.timm_layout import to_timm
from vit_jax.checkpoint.train_ckpt import Checkpointer

__all__ = ['Checkpointer', 'ModelSpec', 'check_params', 'from_timm', 'load_for_model', 'load_npz',
           'load_safetensors', 'read_npz', 'save_npz', 'save_safetensors', 'to_timm']
