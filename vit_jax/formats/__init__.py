"""Foreign param files: the official .npz layouts (`npz`), timm state dicts and .safetensors
files (`timm_layout`), and telling files apart (`files`). Importing this package imports no JAX:
each name loads its module on first use (so `files` and `weights` stay cheap for the commands'
checks before the heavy imports)."""

from vit_jax import lazy

__getattr__ = lazy.attributes(__name__, {
    'check_params': 'npz', 'load_for_model': 'npz', 'load_npz': 'npz', 'read_npz': 'npz',
    'save_npz': 'npz', 'from_timm': 'timm_layout', 'load_safetensors': 'timm_layout',
    'save_safetensors': 'timm_layout', 'to_timm': 'timm_layout'})

__all__ = ['check_params', 'from_timm', 'load_for_model', 'load_npz', 'load_safetensors',
           'read_npz', 'save_npz', 'save_safetensors', 'to_timm']
