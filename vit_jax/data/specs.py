"""What preprocessing a run is asked for, parsed and checked once, without TensorFlow.

`of_config(config)` parses a config's `pp.train` and `pp.eval` (lists of registered op calls,
'pad_crop(pad=2)|flip': vit_jax/data/ops.py) into a `Preprocessing`; config validation calls it
once per run and the run passes the result on to its streams, evaluators and records.
`train_spec` and `eval_spec` parse one list (eval preprocessing has no random op).
"""

import dataclasses
from typing import Optional, Tuple

from vit_jax.data import ops
from vit_jax.errors import UserError


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


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """A run's parsed train and eval preprocessing."""
  train: Spec
  eval: Spec

  def input_channels(self, stored_channels: Optional[int]) -> int:
    """The channels of the model's input: what the train ops give (a `channels(n)` op), else the
    stored images' (3 when unknown); UserError when the eval ops give another count."""
    stored = stored_channels or 3
    train = self.train.channels or stored
    evaluated = self.eval.channels or stored
    if train != evaluated:
      raise UserError(f'the train preprocessing gives {train}-channel images and the eval '
                      f'preprocessing {evaluated}-channel ones: end both config.pp.train and '
                      f'config.pp.eval with the same channels(n)')
    return train

  def op_names(self) -> Tuple[str, ...]:
    """The names of the ops both lists call."""
    return tuple(c.name for spec in (self.train, self.eval) for c in spec.ops.calls)


def _check_size(image_size, key: str) -> None:
  if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
    raise UserError(f'config.{key}: the output side (config.image_size) must be an int >= 1, '
                    f'got {image_size!r}')


def train_spec(text: str, image_size: int, key: str = 'pp.train') -> Spec:
  """The train op list `text` for `image_size` px outputs, checked (UserError naming `key`)."""
  _check_size(image_size, key)
  return Spec(ops.parse(text, image_size, key), True)


def eval_spec(text: str, image_size: int, key: str = 'pp.eval') -> Spec:
  """The eval op list `text`, checked as `train_spec` does and deterministic."""
  _check_size(image_size, key)
  op_list = ops.parse(text, image_size, key)
  random = [str(c) for c in op_list.calls if ops.OPS.get(c.name).attrs.get('random')]
  if random:
    raise UserError(f'config.{key}: {", ".join(random)} draws at random: eval preprocessing is '
                    f'deterministic; use central_crop or resize')
  return Spec(op_list, False)


def of_config(config) -> Preprocessing:
  """A config's `pp.train` and `pp.eval` at `image_size`, parsed and checked."""
  return Preprocessing(train_spec(config.pp.train, config.image_size),
                       eval_spec(config.pp.eval, config.image_size))


__all__ = ['Preprocessing', 'Spec', 'eval_spec', 'of_config', 'train_spec']
