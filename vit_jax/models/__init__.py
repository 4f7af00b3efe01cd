"""Flax linen models: `create_model('ViT-B/16', num_classes=1000)` -> `VisionTransformer`,
`create_model('BiT-R50x1', num_classes=1000)` -> `BiT`."""

from typing import Any

import flax.linen as nn

from vit_jax.models.bit import BiT
from vit_jax.models.options import OPTIONS, check as check_options
from vit_jax.models.resnet import ResNetConfig
from vit_jax.models.variants import BASES, HYBRIDS, VARIANTS, decode, decode_variant
from vit_jax.models.vit import VisionTransformer, token_grid

__all__ = ['create_model', 'decode_variant', 'VARIANTS', 'VisionTransformer', 'BiT',
           'ResNetConfig', 'OPTIONS', 'BASES', 'HYBRIDS', 'token_grid', 'check_options']


def create_model(name: str, *, num_classes: int, **overrides: Any) -> nn.Module:
  """The module of variant `name` (see `VARIANTS`) with option overrides, checked by the one check
  of model options (models/options.py: valid values; an option the family does not have must
  stay at its default)."""
  cls, kwargs = check_options(name, overrides)
  return cls(num_classes=num_classes, **kwargs)
