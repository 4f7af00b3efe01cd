"""A stand-in for torchvision, which timm 1.0.31 imports at module level but which has no CPU wheel
for torch 2.13 here (the PyPI wheels are CUDA builds).

timm imports `torchvision.ops.misc.FrozenBatchNorm2d` (norm layers), `torchvision.transforms` and
`torchvision.datasets` (its data package). The ViT and ResNetV2 models these tests build use none of
them. Every name of the stand-in is a class that raises when it is instantiated or called, so a code
path that does need torchvision fails loudly instead of computing something else. Names that timm
imports inside `try: ... except ImportError` (optional features) are absent, so timm takes its own
fallback; `InterpolationMode`, which timm reads at import time, is an enum of torchvision's values.
"""

import enum
import sys
import types

MODULES = ('torchvision', 'torchvision.ops', 'torchvision.ops.misc', 'torchvision.transforms',
           'torchvision.transforms.functional', 'torchvision.datasets', 'torchvision.utils')
# Imported by timm inside try/except ImportError: leave them out, timm then uses its fallback.
_OPTIONAL = frozenset({'Places365', 'INaturalist', 'QMNIST', 'ImageNet', 'models'})
# timm builds lookup tables from this enum at import time (values as in torchvision).
_INTERPOLATION = enum.Enum('InterpolationMode', {
    n.upper().replace('-', '_'): n
    for n in ('nearest', 'nearest-exact', 'bilinear', 'bicubic', 'box', 'hamming', 'lanczos')})


def _unavailable(qualname: str) -> type:
  def fail(*args, **kwargs):
    raise RuntimeError(f'{qualname} is a stand-in (tests/interop/torchvision_stub.py): this code '
                       'path needs the real torchvision')
  return type(qualname.rsplit('.', 1)[-1], (), {'__init__': fail, '__call__': fail})


def _module(name: str) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__path__ = []  # a package, so submodules resolve

  def getattr_(attr):
    if attr in _OPTIONAL or attr.startswith('__'):
      raise AttributeError(attr)
    value = _unavailable(f'{name}.{attr}')
    setattr(module, attr, value)
    return value
  module.__getattr__ = getattr_
  return module


def install(force: bool = False) -> bool:
  """Puts the stand-in into sys.modules unless a real torchvision is importable (or `force`);
  True if it did."""
  if not force:
    try:
      import torchvision  # pylint: disable=g-import-not-at-top,unused-import
      return False
    except ImportError:
      pass
  for name in MODULES:
    sys.modules[name] = _module(name)
  sys.modules['torchvision.transforms'].InterpolationMode = _INTERPOLATION
  sys.modules['torchvision.transforms.functional'].InterpolationMode = _INTERPOLATION
  for name in MODULES[1:]:
    parent, _, child = name.rpartition('.')
    setattr(sys.modules[parent], child, sys.modules[name])
  return True
