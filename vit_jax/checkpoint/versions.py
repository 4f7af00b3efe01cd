"""The config a checkpoint recorded, checked against the states of vit_jax that wrote it.

`refuse_earlier(stored_config, where)` is the one restore-time check of a stored config: a
checkpoint written by an earlier, unreleased state of vit_jax 0.1.0 (its config holds a key
this version retired) is refused in one line naming the key and what replaced it. Resuming,
`config.init`, `predict`, `fewshot`, `export` and `analyze` all restore through it.
"""

from typing import Mapping

from vit_jax.errors import UserError

VERSION = '0.1.0'

# Config keys of earlier states -> what replaced them.
RETIRED_KEYS = {
    'pp.train_crop': 'the train op list pp.train',
    'pp.eval_crop': 'the eval op list pp.eval',
    'pp.resize': 'the resize argument of the ops in pp.train and pp.eval',
    'pp.pad': 'the pad argument of pad_crop in pp.train',
    'pp.flip': 'the flip op in pp.train',
    'pp.channels': 'the channels(n) op in pp.train and pp.eval',
    'randaug': 'the randaug op in pp.train',
    'input_pipeline': 'the one tf.data pipeline for every source',
    'xla_cpu_schedule': 'the XLA:CPU scheduler chosen by the platform',
}


def _has(config: Mapping, key: str) -> bool:
  node = config
  for part in key.split('.'):
    if not isinstance(node, Mapping) or part not in node:
      return False
    node = node[part]
  return True


def refuse_earlier(stored_config: Mapping, where: str) -> None:
  """UserError if `stored_config` (a checkpoint's) was written by an earlier state (module
  docstring)."""
  for key, replaced_by in RETIRED_KEYS.items():
    if _has(stored_config, key):
      raise UserError(f'{where} was written by an earlier, unreleased state of vit_jax {VERSION} '
                      f'(its config has {key}, now {replaced_by}): this version neither resumes '
                      f'nor loads it; train it again with this version')


__all__ = ['RETIRED_KEYS', 'VERSION', 'refuse_earlier']
