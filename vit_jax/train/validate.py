"""The one validation of a training config, before anything is built: tables, one line per mistake.

Types are enforced by the locked ConfigDict. This checks, in order, every key of `CHOICES` (the
valid values come from the module that uses them, so the table cannot drift from the code), every
range of `RANGES`, the variant and its `config.model` options (the one check of model options,
`models.check_options`, with the task's own options applied), the preprocessing ops and
evaluators the config names (their registries: vit_jax/data/ops.py, vit_jax/evaluate/registry.py),
then the combinations that no single key shows. It runs once per run, in the train command right
after parsing flags, else in `build_program`, and returns what it resolved (`Checked`: the run's
task, `tasks.get_task`, and its parsed preprocessing, `specs.of_config`), which the run passes on.

Messages name the key as `config.<key>`; the command line spells it as the flag `config.<key>`
(vit_jax/cli.py).
"""

import dataclasses
import importlib
from typing import Any, Callable, Tuple

from vit_jax import models
from vit_jax import tasks
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.evaluate import registry as evaluators
from vit_jax.train import optim
from vit_jax.train import patch_sizes

_POSITIVE = (lambda v: v > 0, 'a number > 0')
_NON_NEGATIVE = (lambda v: v >= 0, 'a number >= 0')
_AT_LEAST_ONE = (lambda v: v >= 1, 'an integer >= 1')
_FRACTION = (lambda v: 0 <= v < 1, 'in [0, 1)')
_CLASSES = (lambda v: v >= 1, "the head's width (>= 1), or unset (None: the dataset's class count); "
            'leave it unset to use the dataset')

# key -> (predicate, what the value must be); a key missing from a config is not checked.
RANGES: Tuple[Tuple[str, Tuple[Callable[[Any], bool], str]], ...] = (
    ('num_classes', _CLASSES),
    ('batch_size', _AT_LEAST_ONE),
    ('eval_batch_size', _AT_LEAST_ONE),
    ('accum_steps', _AT_LEAST_ONE),
    ('image_size', _AT_LEAST_ONE),
    ('total_steps', _AT_LEAST_ONE),
    ('total_epochs', _POSITIVE),
    ('warmup_steps', _NON_NEGATIVE),
    ('lr', _POSITIVE),
    ('lr_end', _NON_NEGATIVE),
    ('b1', _FRACTION),
    ('b2', _FRACTION),
    ('momentum', _FRACTION),
    ('weight_decay', _NON_NEGATIVE),
    ('grad_clip_norm', _NON_NEGATIVE),
    ('label_smoothing', _FRACTION),
    ('log_every', _AT_LEAST_ONE),
    ('eval_every', _AT_LEAST_ONE),
    ('checkpoint_every', _AT_LEAST_ONE),
    ('keep_checkpoints', _AT_LEAST_ONE),
    ('max_nonfinite_steps', _NON_NEGATIVE),
    ('shuffle_buffer', _AT_LEAST_ONE),
    ('prefetch', _AT_LEAST_ONE),
)


def _from(module: str, name: str) -> Callable[[], Tuple[str, ...]]:
  """The valid values of a key: the constant `name` of the module that uses them, imported when
  the check runs (so this table never holds a copy that could drift)."""
  return lambda: tuple(getattr(importlib.import_module(f'vit_jax.{module}'), name))


# key -> () -> the valid values (None in a config = the key's default, not checked).
CHOICES: Tuple[Tuple[str, Callable[[], Tuple[str, ...]]], ...] = (
    ('loss', _from('tasks', 'CHOICES')),
    ('optimizer', _from('train.choices', 'OPTIMIZERS')),
    ('decay_type', _from('train.choices', 'DECAY_TYPES')),
    ('weight_decay_mask', _from('train.choices', 'WEIGHT_DECAY_MASKS')),
    ('parallelism', _from('parallel.choices', 'PARALLELISMS')),
    ('data_sharding', _from('data.choices', 'SHARDINGS')),
    ('init_posemb_resize', _from('models.posemb_resize', 'METHODS')),
)


def _lookup(config, key: str):
  node = config
  for part in key.split('.'):
    if part not in node:
      return None
    node = node[part]
  return node


def check_values(config) -> None:
  """Raises a UserError naming the first key whose value is out of range."""
  for key, (ok, what) in RANGES:
    value = _lookup(config, key)
    if value is not None and not ok(value):
      raise UserError(f'config.{key}={value!r} is out of range: it must be {what}')


def check_choices(config) -> None:
  """Raises a UserError naming the first key whose value is not one of its choices."""
  for key, choices in CHOICES:
    value = _lookup(config, key)
    if value is None:
      continue
    valid = tuple(choices())
    if value not in valid:
      raise UserError(f'unknown {key.rsplit(".", 1)[-1]} {value!r}: use config.{key}= one of '
                      f'{", ".join(map(str, valid))}')


@dataclasses.dataclass(frozen=True)
class Checked:
  """What the one validation resolved, passed on by the run: its task and preprocessing."""
  task: tasks.Task
  pp: specs.Preprocessing


def check_registered(config) -> specs.Preprocessing:
  """The preprocessing ops (`pp.train`, `pp.eval`) and the evaluator entries (`evals`) a config
  names: registered, their arguments fitting (vit_jax/registry.py); eval ops deterministic. The
  parsed preprocessing."""
  pp = specs.of_config(config)
  evaluators.check(config)
  return pp


def check_config(config) -> Checked:
  """Every mistake a config alone shows, found before devices or data are touched; the run's
  task and parsed preprocessing. Everything up to the model's options is checked before JAX is
  imported; the options a family does not have are read from its Flax module's fields, last."""
  check_choices(config)
  check_values(config)
  if config.total_steps:  # counted in epochs, the steps are known once the dataset is
    optim.check_warmup(config.warmup_steps, config.total_steps)
  task = tasks.get_task(config)
  options = task.model_options(config.model.to_dict())
  models.variants.family(config.model_name)  # an unknown variant: one line listing the valid ones
  models.option_values.check_values(options, prefix='config.model.')
  patch_sizes.check(config)
  pp = check_registered(config)
  if config.model.classifier == 'unpooled':
    raise UserError('config.model.classifier=unpooled gives per-token logits, which the trainer '
                    'cannot score: train with config.model.classifier=token or gap')
  models.check_options(config.model_name, options, prefix='config.model.')  # loads Flax
  return Checked(task, pp)


__all__ = ['CHOICES', 'Checked', 'RANGES', 'check_choices', 'check_config', 'check_registered',
           'check_values']
