"""Flax linen models: `create_model('ViT-B/16', num_classes=1000)` -> `VisionTransformer`,
`create_model('BiT-R50x1', num_classes=1000)` -> `BiT`.

The names load their module on first use: the config's one validation checks a variant name and
its option values (`check_options`) before Flax and JAX are imported.
"""

from typing import Any, Mapping

from vit_jax import lazy

# name -> the module that defines it
_HOMES = {
    'BiT': 'bit', 'OPTIONS': 'options', 'ResNetConfig': 'resnet',
    'BASES': 'variants', 'HYBRIDS': 'variants', 'VARIANTS': 'variants', 'decode': 'variants',
    'decode_variant': 'variants', 'VisionTransformer': 'vit', 'token_grid': 'vit',
}

__getattr__ = lazy.attributes(__name__, _HOMES)


def check_options(name: str, options: Mapping[str, Any], prefix: str = 'model.'):
  """(module class, its kwargs) of variant `name` with `options`: models/options.py's `check`."""
  from vit_jax.models import options as options_lib  # pylint: disable=g-import-not-at-top
  return options_lib.check(name, options, prefix)


def create_model(name: str, *, num_classes: int, **overrides: Any):
  """The module of variant `name` (see `VARIANTS`) with option overrides, checked by the one check
  of model options (models/options.py: valid values; an option the family does not have must
  stay at its default)."""
  cls, kwargs = check_options(name, overrides)
  return cls(num_classes=num_classes, **kwargs)


__all__ = ['create_model', 'decode_variant', 'VARIANTS', 'VisionTransformer', 'BiT',
           'ResNetConfig', 'OPTIONS', 'BASES', 'HYBRIDS', 'token_grid', 'check_options']
