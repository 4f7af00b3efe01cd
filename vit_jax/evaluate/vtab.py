"""VTAB-1k as an evaluator: the fine-tunes of one checkpoint on the benchmark's tasks with the
paper's recipe (vit_jax/configs/finetune.py with dataset=vtab/<task>: 2,500 steps at lr 0.01,
384 px; ViT paper, Appendix B.1.1), then each task's top-1, the natural / specialized /
structured means and the mean over the 19 (vit_jax/data/sources/vtab.py `aggregate`).

Each task is one run trained as a sweep trains its runs (vit_jax/tools/sweeps/trials.py, handed
down by the `evaluate` command, since this layer is below the trainer): the trainer in its own
process (or in this one, launcher='inline'), in `<table directory>/vtab/task_<task>/`.
A trial that finished wrote `sweep_result.json` and is not trained again; an unfinished one
resumes from its own checkpoint. A SIGTERM or Ctrl-C is passed to the running trainer, which
saves a checkpoint and stops; the command then stops with one line.
"""

import os
from typing import Any, Callable, Dict, Tuple

from vit_jax import registry
from vit_jax.errors import UserError

TRIALS = 'vtab'  # the trials' folder in the table directory
LAUNCHERS = ('process', 'inline')  # the sweep runner's (checked here before anything loads)
# Architecture options of the checkpoint's model that its fine-tunes keep (the recipe sets
# the others: dropout, no pre-logits).
KEPT_MODEL_OPTIONS = ('classifier', 'posemb', 'num_registers', 'flexi_patch', 'flexi_grid',
                      'gelu_approximate')


def _in_group_order() -> Tuple[str, ...]:
  """The 19 tasks in the paper's group order (natural, specialized, structured)."""
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  return tuple(t for group in vtab_data.GROUPS.values() for t in group)


def task_names(tasks: str) -> Tuple[str, ...]:
  """'all' -> the 19 tasks in the paper's group order; 'a+b' -> those; ValueError otherwise."""
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  ordered = _in_group_order()
  if tasks == 'all':
    return ordered
  names = tuple(t for t in str(tasks).split('+') if t)
  unknown = [t for t in names if t not in vtab_data.TASKS]
  if unknown or not names:
    raise ValueError(f'unknown VTAB task {unknown[0] if unknown else tasks!r}: use all, or task '
                     f'names joined by + from {", ".join(ordered)}')
  return tuple(t for t in ordered if t in names)


def parse_overrides(text: str) -> Tuple[Tuple[str, Any], ...]:
  """'total_steps=500,model.dtype=bfloat16' -> ((key, value), ...), values read as Python
  literals where they are one (else as strings)."""
  out = []
  for part in (p.strip() for p in str(text or '').split(',')):
    if not part:
      continue
    key, eq, raw = part.partition('=')
    if not eq or not key.strip():
      raise ValueError(f'{part!r} is not key=value (a config key of the fine-tuning recipe)')
    out.append((key.strip(), registry.option_value(raw)))
  return tuple(out)


def recipe_config(model_name: str, task: str):
  """The fine-tuning recipe's config of `task` for `model_name` (vit_jax/configs/finetune.py)."""
  from vit_jax.configs import finetune  # pylint: disable=g-import-not-at-top
  return finetune.get_config(f'model={model_name},dataset=vtab/{task}')


def _has_key(config, key: str) -> bool:
  node = config
  for part in key.split('.'):
    if not hasattr(node, 'keys') or part not in node:
      return False
    node = node[part]
  return True


def check_options(tasks: str, overrides: str, launcher: str) -> None:
  """UserError (starting with the option) for a bad task list, override or launcher."""
  try:
    task_names(tasks)
  except ValueError as e:
    raise UserError(f'tasks={tasks!r}: {e}') from None
  try:
    pairs = parse_overrides(overrides)
  except ValueError as e:
    raise UserError(f'overrides={overrides!r}: {e}') from None
  recipe = recipe_config('B/16', 'dtd')
  for key, _ in pairs:
    if not _has_key(recipe, key):
      raise UserError(f'overrides={overrides!r}: {key!r} is not a config key of the fine-tuning '
                      f'recipe (configs/README.md lists them)')
  if launcher not in LAUNCHERS:
    raise UserError(f'launcher={launcher!r}: use {" or ".join(LAUNCHERS)}')


def trials(config, init: str, tasks: str = 'all', overrides: str = '') -> Dict[str, Any]:
  """{task: its fine-tune from `init`} as the trainer's runner takes them (a `Trial` of
  vit_jax/tools/sweeps/trials.py, given as a dict of its fields): the recipe at
  the checkpoint's model (its architecture options kept), `config`'s data_dir, then
  `overrides`."""
  from vit_jax.configs import finetune  # pylint: disable=g-import-not-at-top
  out = {}
  for task in task_names(tasks):
    recipe = recipe_config(config.model_name, task)
    kept = [(f'model.{k}', config.model[k]) for k in KEPT_MODEL_OPTIONS
            if k in config.model and k in recipe.model and config.model[k] != recipe.model[k]]
    # The recipe spells ViT names only: the model's own name (a Mixer's, a BiT's) is set after.
    fixed = [('init', init), ('model_name', config.model_name), ('progress', False)]
    if config.get('data_dir'):
      fixed.append(('data_dir', config.data_dir))
    merged = dict(fixed + kept)
    merged.update(parse_overrides(overrides))
    out[task] = {'config': f'{finetune.__file__}:model={config.model_name},dataset=vtab/{task}',
                 'overrides': tuple(merged.items()), 'folder': TRIALS, 'key': 'task'}
  return out


def fine_tune(config, init: str, directory: str, train: Callable, tasks: str = 'all',
              overrides: str = '', launcher: str = 'process',
              say: Callable[[str], None] = print) -> Dict[str, float]:
  """{task: top-1} of the fine-tunes of `init` on `tasks` by `train` (the trainer's runner,
  vit_jax/tools/sweeps/trials.py `run_trials`, handed down by the command), in
  `directory`/vtab/task_<task>/. Every dataset of a task still to train is checked first."""
  from vit_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import results  # pylint: disable=g-import-not-at-top

  def check_data(names):  # an unprepared dataset is refused before anything trains
    for name in names:
      data_lib.get_info(vtab_data.PREFIX + name, config.get('data_dir'))

  top1 = train(trials(config, init, tasks, overrides), directory, launcher=launcher, say=say,
               before=check_data)
  os.makedirs(os.path.join(directory, TRIALS), exist_ok=True)
  results.write_text(os.path.join(directory, TRIALS, 'table.md'), vtab_data.table(top1).rstrip())
  return top1


def metrics(top1: Dict[str, float]) -> Dict[str, float]:
  """The table's metrics: each task's top-1 in the paper's group order, then the group means
  and the mean over the 19 where all their tasks ran."""
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  ordered = [t for t in _in_group_order() if t in top1]
  return {**{t: top1[t] for t in ordered}, **vtab_data.aggregate(top1)}


__all__ = ['KEPT_MODEL_OPTIONS', 'LAUNCHERS', 'TRIALS', 'check_options', 'fine_tune', 'metrics',
           'parse_overrides', 'recipe_config', 'task_names', 'trials']
