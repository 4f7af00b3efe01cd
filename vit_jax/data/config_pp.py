"""The preprocessing a config asks for: the one place that reads `config.pp` and `config.randaug`.

`train_pp(config)` and `eval_pp(config)` give the mappings `specs.train_spec` and
`specs.eval_spec` read: `pp.train` / `pp.eval` (lists of registered op calls,
vit_jax/data/ops.py) when set, else the older keys that compose them; training, bundles, the
analyses and few-shot evaluation all call these. `input_channels` is what the model gets.
"""

from typing import Optional

from vit_jax.data import specs
from vit_jax.errors import UserError


def _ops_text(config, which: str) -> str:
  # A config recorded before `pp.train` and `pp.eval` existed (a checkpoint's stored config)
  # lacks them: it composes its lists from the older keys, as it did then.
  return config.pp.get(which) or ''


def train_pp(config) -> dict:
  """The train preprocessing of a config (what `specs.train_spec` reads)."""
  if _ops_text(config, 'train'):
    return dict(ops=config.pp.train, image_size=config.image_size)
  return dict(crop=config.pp.train_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, pad=config.pp.pad,
              flip=config.pp.flip, channels=config.pp.channels,
              randaug_layers=config.randaug.num_layers,
              randaug_magnitude=config.randaug.magnitude)


def eval_pp(config) -> dict:
  """The eval preprocessing of a config (what `specs.eval_spec` reads)."""
  if _ops_text(config, 'eval'):
    return dict(ops=config.pp.eval, image_size=config.image_size)
  return dict(crop=config.pp.eval_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, channels=config.pp.channels)


def input_channels(config, stored_channels: Optional[int]) -> int:
  """The channels of the model's input: what the train ops give (a `channels(n)` op, or
  `pp.channels`), else the stored images' (3 when unknown); UserError when the eval ops give
  another count."""
  stored = stored_channels or 3
  train = specs.train_spec(train_pp(config)).channels or stored
  evaluated = specs.eval_spec(eval_pp(config)).channels or stored
  if train != evaluated:
    raise UserError(f'the train preprocessing gives {train}-channel images and the eval '
                    f'preprocessing {evaluated}-channel ones: end both with the same channels(n) '
                    f'(config.pp.train, config.pp.eval, or config.pp.channels for both)')
  return train


__all__ = ['eval_pp', 'input_channels', 'train_pp']
