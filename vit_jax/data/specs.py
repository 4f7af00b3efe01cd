"""What preprocessing a pipeline is asked for, validated, without TensorFlow: `TrainSpec` and
`EvalSpec` (the crop modes are described in `preprocess`, which implements them in TensorFlow;
`arrays` implements a subset in NumPy for the embedded datasets)."""

import dataclasses
from typing import Any, Optional

from vit_jax.data.choices import EVAL_CROPS, TRAIN_CROPS
from vit_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """Train preprocessing; see the module docstring for the crop modes."""
  crop: str
  image_size: int
  resize: Optional[int] = None  # shorter side before the crop ('resize_crop')
  pad: Optional[int] = None  # pixels per side ('pad_crop')
  flip: bool = False  # random horizontal flip, p = 0.5 (leave off for digits)
  channels: Optional[int] = None  # None: as stored; 3 tiles grayscale; 1 converts RGB to gray
  randaug_layers: int = 0  # RandAugment ops per image (0 = off)
  randaug_magnitude: float = 10  # RandAugment magnitude (10 = each op's maximum)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """Eval preprocessing; see the module docstring for the crop modes."""
  crop: str
  image_size: int
  resize: Optional[int] = None  # shorter side before the central crop ('central')
  channels: Optional[int] = None


_ALL_KEYS = frozenset(f.name for f in dataclasses.fields(TrainSpec)) | frozenset(
    f.name for f in dataclasses.fields(EvalSpec))


def train_spec(pp: Any) -> TrainSpec:
  """Validates a train `pp` mapping/ConfigDict (keys of `TrainSpec`) into a `TrainSpec`."""
  values = _read(pp, TrainSpec, 'train')
  spec = TrainSpec(**values)
  _check_choice(spec.crop, TRAIN_CROPS, 'train')
  if spec.crop == 'resize_crop':
    _check_int(spec.resize, 'resize', f'the shorter side for resize_crop, >= image_size '
               f'({spec.image_size})', minimum=spec.image_size)
  if spec.crop == 'pad_crop':
    _check_int(spec.pad, 'pad', 'pixels of zero padding per side for pad_crop', minimum=0)
  check_randaug(spec.randaug_layers, spec.randaug_magnitude)
  return spec


def eval_spec(pp: Any) -> EvalSpec:
  """Validates an eval `pp` mapping/ConfigDict (keys of `EvalSpec`) into an `EvalSpec`."""
  spec = EvalSpec(**_read(pp, EvalSpec, 'eval'))
  _check_choice(spec.crop, EVAL_CROPS, 'eval')
  if spec.crop == 'central':
    _check_int(spec.resize, 'resize', f'the shorter side before the central crop, >= image_size '
               f'({spec.image_size})', minimum=spec.image_size)
  return spec


def _read(pp: Any, cls, kind: str) -> dict[str, Any]:
  """Reads the fields of `cls` from `pp`; keys known to the other spec are ignored."""
  if not hasattr(pp, 'keys'):
    raise UserError(f'{kind} preprocessing must be a dict or ConfigDict with keys '
                    f'{sorted(_ALL_KEYS)}, got {type(pp).__name__}')
  unknown = sorted(set(pp.keys()) - _ALL_KEYS)
  if unknown:
    raise UserError(f'unknown {kind} preprocessing key(s) {unknown}; valid keys: '
                    f'{sorted(_ALL_KEYS)}')
  values = {f.name: pp[f.name] for f in dataclasses.fields(cls) if f.name in pp.keys()}
  for required in ('crop', 'image_size'):
    if values.get(required) is None:
      raise UserError(f"{kind} preprocessing needs '{required}' (e.g. crop='resize', "
                      f"image_size=224)")
  _check_int(values['image_size'], 'image_size', 'the output side in pixels', minimum=1)
  if values.get('channels') not in (None, 1, 3):
    raise UserError(f"{kind} preprocessing 'channels' must be None (as stored), 1 or 3, got "
                    f"{values['channels']!r}")
  return values


def _check_choice(value, choices, kind):
  if value not in choices:
    raise UserError(f"{kind} crop {value!r} is not one of {', '.join(choices)}")


def _check_int(value, key, meaning, minimum):
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise UserError(f"preprocessing '{key}' ({meaning}) must be an int >= {minimum}, got "
                    f"{value!r}")


def check_randaug(num_layers, magnitude) -> None:
  if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 0:
    raise UserError(f'randaug.num_layers={num_layers!r} must be an int >= 0 (0 = off)')
  if isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)) or magnitude < 0:
    raise UserError(f'randaug.magnitude={magnitude!r} must be a number >= 0 (10 = each op at '
                    f'its RandAugment maximum)')


__all__ = ['EvalSpec', 'TrainSpec', 'check_randaug', 'eval_spec', 'train_spec']
