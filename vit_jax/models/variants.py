"""The one variant table: model name -> module class and its kwargs.

Plain ViTs decode from the name: 'ViT-<base>/<patch>' with any integer patch size, e.g. 'ViT-B/16',
'ViT-Mu/4'. Hybrids are explicit entries, because the number after the name is the total
downsampling (ResNet stride x patch), not the patch size (the original `configs/models.py`). BiT ResNets
(models/bit.py) decode from 'BiT-R<depth>x<width>', e.g. 'BiT-R50x1', 'BiT-R26x0.5'.
"""

import re
from typing import Any, Dict, Tuple

from vit_jax.errors import UserError
from vit_jax.models.bit_width import root_width

# Transformer shape of each base (ViT paper, Table 1; Mu and Ze are small CPU bases for 28 px).
BASES: Dict[str, Dict[str, int]] = {
    'Ti': dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768),
    'S': dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536),
    'B': dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072),
    'L': dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096),
    'H': dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120),
    'Mu': dict(hidden_size=64, num_layers=6, num_heads=4, mlp_dim=256),
    'Ze': dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64),
}

# Hybrid name -> (base, ResNet units per stage (() = stem only), ViT patch size on the feature map).
HYBRIDS: Dict[str, Tuple[str, Tuple[int, ...], int]] = {
    'R50+ViT-B/16': ('B', (3, 4, 9), 1),       # stage 4 removed, its units moved into stage 3
    # Standard R50 (ViT paper, Table 6); not in the original vision_transformer code's model test.
    'R50+ViT-B/32': ('B', (3, 4, 6, 3), 1),
    'R50+ViT-L/32': ('L', (3, 4, 6, 3), 1),
    'R50+ViT-L/16': ('L', (3, 4, 9), 1),       # as R50+ViT-B/16 (ViT paper, Tables 3 and 6)
    'R26+ViT-S/32': ('S', (2, 2, 2, 2), 1),
    'R26+ViT-B/32': ('B', (2, 2, 2, 2), 1),
    'R+ViT-Ti/16': ('Ti', (), 8),              # stem stride 4 x patch 8: 7x7 grid (50 tokens) @224
    'R+ViT-Mu/4': ('Mu', (), 1),               # stem only, 7x7 grid at 28 px
    'R+ViT-Ze/4': ('Ze', (), 1),
}

# BiT depth -> units per stage (depth = 3 x units + 2): BiT's 50/101/152, big_vision's 26 and R14
# (one unit per stage) for CPU work. Any width factor that is a multiple of 0.5 decodes.
BIT_DEPTHS: Dict[int, Tuple[int, ...]] = {
    14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
# Small BiTs for 28 px CPU work (half width: 32 channels after the root). R50x0.5 costs about what
# ViT-Mu/4 and R+ViT-Mu/4 cost per image; R14x0.5 is the tiny one for tests (docs/models.md).
BIT_SMALL: Tuple[str, ...] = ('BiT-R50x0.5', 'BiT-R26x0.5', 'BiT-R14x0.5')

# MLP-Mixer sizes (the Mixer paper, Table 1; the original repository's configs/models.py): width,
# blocks, token-mixing and channel-mixing MLP widths. 'Ze' is a tiny one for tests.
MIXER_BASES: Dict[str, Dict[str, int]] = {
    'S': dict(hidden_size=512, num_layers=8, tokens_mlp_dim=256, channels_mlp_dim=2048),
    'B': dict(hidden_size=768, num_layers=12, tokens_mlp_dim=384, channels_mlp_dim=3072),
    'L': dict(hidden_size=1024, num_layers=24, tokens_mlp_dim=512, channels_mlp_dim=4096),
    'Ze': dict(hidden_size=32, num_layers=2, tokens_mlp_dim=16, channels_mlp_dim=64),
}
MIXERS: Tuple[str, ...] = ('Mixer-S/32', 'Mixer-S/16', 'Mixer-B/32', 'Mixer-B/16', 'Mixer-L/32',
                           'Mixer-L/16', 'Mixer-Ze/4')

# Registered names: the released / reference models plus the small CPU ones.
VARIANTS: Tuple[str, ...] = (
    'ViT-Ti/16', 'ViT-S/16', 'ViT-S/32', 'ViT-B/8', 'ViT-B/16', 'ViT-B/32', 'ViT-L/16',
    'ViT-L/32', 'ViT-H/14', 'ViT-Mu/4', 'ViT-Ze/4', *HYBRIDS,
    *(f'BiT-R{depth}x{width}' for depth in (50, 101, 152) for width in (1, 2, 3, 4)), *BIT_SMALL,
    *MIXERS)

_VIT_NAME = re.compile(r'ViT-(?P<base>[A-Za-z]+)/(?P<patch>\d+)')
_MIXER_NAME = re.compile(r'Mixer-(?P<base>[A-Za-z]+)/(?P<patch>\d+)')
_BIT_NAME = re.compile(r'BiT-R(?P<depth>\d+)x(?P<width>\d+(?:\.\d+)?)')


def _unknown(name: str) -> UserError:
  return UserError(
      f'unknown model {name!r}: use ViT-<base>/<patch> with base in {",".join(BASES)} '
      f'(e.g. ViT-B/16, ViT-Mu/4), BiT-R<depth>x<width> with depth in '
      f'{",".join(map(str, BIT_DEPTHS))} (e.g. BiT-R50x1), Mixer-<base>/<patch> with base in '
      f'{",".join(MIXER_BASES)} (e.g. Mixer-B/16), or one of: {", ".join(VARIANTS)}')


def family(name: str) -> Tuple[str, Dict[str, Any]]:
  """Variant name -> (name of its module class, its kwargs but num_classes and options; a
  hybrid's `resnet` as a mapping). Reads only the tables above: Flax is not imported."""
  if not isinstance(name, str):
    raise _unknown(str(name))
  if name in HYBRIDS:
    base, stages, patch = HYBRIDS[name]
    return 'VisionTransformer', dict(patch_size=(patch, patch), **BASES[base],
                                     resnet=dict(num_layers=stages, width_factor=1))
  match = _BIT_NAME.fullmatch(name)
  if match is not None:
    if int(match['depth']) not in BIT_DEPTHS:
      raise _unknown(name)
    width = float(match['width'])
    root_width(width)  # a UserError unless 64 x width splits into the GroupNorm groups
    return 'BiT', dict(num_layers=BIT_DEPTHS[int(match['depth'])],
                       width_factor=int(width) if width.is_integer() else width)
  match = _MIXER_NAME.fullmatch(name)
  if match is not None:
    if match['base'] not in MIXER_BASES or int(match['patch']) < 1:
      raise _unknown(name)
    patch = int(match['patch'])
    return 'MlpMixer', dict(patch_size=(patch, patch), **MIXER_BASES[match['base']])
  match = _VIT_NAME.fullmatch(name)
  if match is None or match['base'] not in BASES or int(match['patch']) < 1:
    raise _unknown(name)
  patch = int(match['patch'])
  return 'VisionTransformer', dict(patch_size=(patch, patch), **BASES[match['base']], resnet=None)


def decode(name: str) -> Tuple[type, Dict[str, Any]]:
  """Variant name -> (module class, its kwargs but num_classes and options)."""
  # pylint: disable-next=g-import-not-at-top
  from vit_jax.models import bit, mixer, resnet, vit  # Flax: loaded once a name is known to be valid
  cls_name, kwargs = family(name)
  if kwargs.get('resnet') is not None:
    kwargs['resnet'] = resnet.ResNetConfig(**kwargs['resnet'])
  return {'VisionTransformer': vit.VisionTransformer, 'BiT': bit.BiT,
          'MlpMixer': mixer.MlpMixer}[cls_name], kwargs


def decode_variant(name: str) -> Dict[str, Any]:
  """'ViT-B/16' -> {patch_size, hidden_size, num_layers, num_heads, mlp_dim, resnet};
  'BiT-R50x1' -> {num_layers: units per stage, width_factor}."""
  return decode(name)[1]
