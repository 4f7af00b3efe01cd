"""Flax linen models: `create_model('ViT-B/16', num_classes=1000)` -> `VisionTransformer`,
`create_model('BiT-R50x1', num_classes=1000)` -> `BiT`."""

from typing import Any

import flax.linen as nn

from vit_jax.models.bit import BiT
from vit_jax.models.options import OPTIONS, module_kwargs
from vit_jax.models.resnet import ResNetConfig
from vit_jax.models.variants import BASES, HYBRIDS, VARIANTS, decode, decode_variant
from vit_jax.models.vit import VisionTransformer, token_grid

__all__ = ['create_model', 'decode_variant', 'VARIANTS', 'VisionTransformer', 'BiT',
           'ResNetConfig', 'OPTIONS', 'BASES', 'HYBRIDS', 'token_grid']


def create_model(name: str, *, num_classes: int, **overrides: Any) -> nn.Module:
  """The module of variant `name` (see `VARIANTS`) with option overrides; an option the family
  does not have must stay at its default (models/options.py)."""
  cls, kwargs = decode(name)
  kwargs.update(module_kwargs(cls, name, overrides))
  return cls(num_classes=num_classes, **kwargs)
