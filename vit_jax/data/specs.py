"""What preprocessing a pipeline is asked for, checked, without TensorFlow.

`train_spec(pp)` and `eval_spec(pp)` read a mapping (or ConfigDict) with 'image_size' and either
'ops', a list of registered op calls ('pad_crop(pad=2)|flip'; vit_jax/data/ops.py), or the older
keys that compose one: 'crop', 'resize', 'pad', 'flip', 'channels', 'randaug_layers',
'randaug_magnitude' (`ops.compose_train`, `ops.compose_eval`). Eval preprocessing has no random
op. `config_pp` gives a config's two mappings.
"""

import dataclasses
from typing import Any, Optional

from vit_jax.data import ops
from vit_jax.errors import UserError

_TRAIN_KEYS = ('crop', 'resize', 'pad', 'flip', 'channels', 'randaug_layers', 'randaug_magnitude')
_EVAL_KEYS = ('crop', 'resize', 'channels')
_ALL_KEYS = frozenset(('ops', 'image_size') + _TRAIN_KEYS)


@dataclasses.dataclass(frozen=True)
class Spec:
  """Checked preprocessing: the op list (its output side is `image_size`)."""
  ops: ops.OpList
  train: bool

  @property
  def image_size(self) -> int:
    return self.ops.size

  @property
  def channels(self) -> Optional[int]:
    """The channels the ops give (a `channels(n)` op), or None: those of the stored images."""
    return self.ops.channels()


def train_spec(pp: Any) -> Spec:
  """The train preprocessing of `pp` (module docstring), checked (UserError naming the key)."""
  values = _read(pp, 'train')
  if 'ops' in values:
    return Spec(ops.parse(values['ops'], values['image_size'], 'pp.train'), True)
  return Spec(ops.compose_train(
      crop=values.get('crop'), size=values['image_size'], resize=values.get('resize'),
      pad=values.get('pad'), flip=bool(values.get('flip')), channels=values.get('channels'),
      randaug_layers=values.get('randaug_layers', 0),
      randaug_magnitude=values.get('randaug_magnitude', 10)), True)


def eval_spec(pp: Any) -> Spec:
  """The eval preprocessing of `pp` (module docstring), checked: deterministic ops only."""
  values = _read(pp, 'eval')
  if 'ops' in values:
    key, op_list = 'pp.eval', ops.parse(values['ops'], values['image_size'], 'pp.eval')
  else:
    key, op_list = 'pp.eval_crop', ops.compose_eval(
        crop=values.get('crop'), size=values['image_size'], resize=values.get('resize'),
        channels=values.get('channels'))
  random = [str(c) for c in op_list.calls if ops.OPS.get(c.name).attrs.get('random')]
  if random:
    raise UserError(f'config.{key}: {", ".join(random)} draws at random: eval preprocessing is '
                    f'deterministic; use central_crop or resize')
  return Spec(op_list, False)


def _read(pp: Any, kind: str) -> dict:
  """The values of `pp` (a mapping or ConfigDict), the output side checked."""
  if not hasattr(pp, 'keys'):
    raise UserError(f'{kind} preprocessing must be a dict or ConfigDict with keys '
                    f'{sorted(_ALL_KEYS)}, got {type(pp).__name__}')
  unknown = sorted(set(pp.keys()) - _ALL_KEYS)
  if unknown:
    raise UserError(f'unknown {kind} preprocessing key(s) {unknown}; valid keys: '
                    f'{sorted(_ALL_KEYS)}')
  values = {k: pp[k] for k in pp.keys() if pp[k] is not None}
  size = values.get('image_size')
  if not isinstance(size, int) or isinstance(size, bool) or size < 1:
    raise UserError(f"{kind} preprocessing 'image_size' (the output side in pixels) must be an "
                    f'int >= 1, got {size!r}')
  if 'ops' not in values and values.get('crop') is None:
    raise UserError(f"{kind} preprocessing needs 'ops' (e.g. 'resize') or 'crop'")
  return values


__all__ = ['Spec', 'eval_spec', 'train_spec']
