"""Foreign param files: the official .npz layouts (`npz`), timm state dicts and .safetensors
files (`timm_layout`), and telling files apart (`files`)."""

from vit_jax.formats.npz import check_params
from vit_jax.formats.npz import load_for_model
from vit_jax.formats.npz import load_npz
from vit_jax.formats.npz import read_npz
from vit_jax.formats.npz import save_npz
from vit_jax.formats.timm_layout import from_timm
from vit_jax.formats.timm_layout import load_safetensors
from vit_jax.formats.timm_layout import save_safetensors
from vit_jax.formats.timm_layout import to_timm

__all__ = ['check_params', 'from_timm', 'load_for_model', 'load_npz', 'load_safetensors',
           'read_npz', 'save_npz', 'save_safetensors', 'to_timm']
