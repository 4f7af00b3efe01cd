"""Flax linen models: `create_model('ViT-B/16', num_classes=1000)` -> `VisionTransformer`."""

import dataclasses
from typing import Any, Dict

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.errors import UserError
from vit_jax.models.resnet import ResNetConfig, as_resnet_config
from vit_jax.models.variants import BASES, HYBRIDS, VARIANTS, decode_variant
from vit_jax.models.vit import CLASSIFIERS, POSEMBS, VisionTransformer, token_grid

__all__ = ['create_model', 'decode_variant', 'VARIANTS', 'VisionTransformer', 'ResNetConfig',
           'OPTIONS', 'BASES', 'HYBRIDS', 'token_grid']

# Every VisionTransformer field a caller may override (num_classes is its own argument).
OPTIONS = tuple(f.name for f in dataclasses.fields(VisionTransformer)
                if f.name not in ('num_classes', 'parent', 'name'))


def _normalise(options: Dict[str, Any]) -> Dict[str, Any]:
  """Type-normalise overrides and reject bad values with a one-line UserError."""
  out = dict(options)
  if isinstance(out.get('patch_size'), int):
    out['patch_size'] = (out['patch_size'], out['patch_size'])
  if 'patch_size' in out:
    out['patch_size'] = tuple(int(p) for p in out['patch_size'])
  if 'resnet' in out:
    out['resnet'] = as_resnet_config(out['resnet'])
  for key in ('dtype', 'param_dtype'):
    if key in out:
      try:
        out[key] = jnp.dtype(out[key]).type
      except TypeError:
        raise UserError(f'{key}={out[key]!r} is not a dtype: use e.g. float32 or bfloat16') from None
  if out.get('classifier', 'token') not in CLASSIFIERS:
    raise UserError(f'unknown classifier {out["classifier"]!r}: use one of {", ".join(CLASSIFIERS)}')
  if out.get('posemb', 'learned') not in POSEMBS:
    raise UserError(f'unknown posemb {out["posemb"]!r}: use one of {", ".join(POSEMBS)}')
  return out


def create_model(name: str, *, num_classes: int, **overrides: Any) -> nn.Module:
  """The VisionTransformer of variant `name` (see `VARIANTS`), with optional field overrides."""
  unknown = sorted(set(overrides) - set(OPTIONS))
  if unknown:
    raise UserError(f'unknown model option(s) {", ".join(unknown)}: valid are {", ".join(OPTIONS)}')
  kwargs = decode_variant(name)
  kwargs.update(_normalise(overrides))
  return VisionTransformer(num_classes=num_classes, **kwargs)
