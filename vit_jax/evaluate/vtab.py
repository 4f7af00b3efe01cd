"""VTAB-1k as an evaluator: the fine-tunes of one checkpoint on the benchmark's tasks with the
paper's recipe (vit_jax/configs/finetune.py with dataset=vtab/<task>: 2,500 steps at lr 0.01,
384 px; ViT paper, Appendix B.1.1), then each task's top-1, the natural / specialized /
structured means and the mean over the 19 (vit_jax/data/sources/vtab.py `aggregate`).

Each task is one trial of the sweep machinery (vit_jax/tools/sweeps/runner.py): the trainer in
its own process (or in this one, launcher='inline'), in `<table directory>/vtab/task_<task>/`.
A trial that finished wrote `sweep_result.json` and is not trained again; an unfinished one
resumes from its own checkpoint. A SIGTERM or Ctrl-C is passed to the running trainer, which
saves a checkpoint and stops; the command then stops with one line.
"""

import json
import os
from typing import Any, Callable, Dict, Optional, Tuple

from vit_jax.errors import UserError
from vit_jax.evaluate import registry

TRIALS = 'vtab'  # the trials' folder in the table directory
LAUNCHERS = ('process', 'inline')
# Architecture options of the checkpoint's model that its fine-tunes keep (the recipe sets
# the others: dropout, no pre-logits).
KEPT_MODEL_OPTIONS = ('classifier', 'posemb', 'num_registers', 'flexi_patch', 'flexi_grid',
                      'gelu_approximate')


def task_names(tasks: str) -> Tuple[str, ...]:
  """'all' -> the 19 tasks in the paper's group order; 'a+b' -> those; ValueError otherwise."""
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  ordered = tuple(t for group in vtab_data.GROUPS.values() for t in group)
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


def trial(task: str, config, init: str, overrides: Tuple[Tuple[str, Any], ...]):
  """(sweep, run) of one task's fine-tune from `init`, as the sweep runner takes them: the
  recipe at the checkpoint's model (its architecture options kept), `config`'s data_dir,
  then `overrides`."""
  from vit_jax.configs import finetune  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import spec  # pylint: disable=g-import-not-at-top
  recipe = recipe_config(config.model_name, task)
  kept = [(f'model.{k}', config.model[k]) for k in KEPT_MODEL_OPTIONS
          if k in config.model and k in recipe.model and config.model[k] != recipe.model[k]]
  fixed = [('init', init), ('progress', False)]
  if config.get('data_dir'):
    fixed.append(('data_dir', config.data_dir))
  merged = dict(fixed + kept)
  merged.update(overrides)
  sweep = spec.Sweep(path='', config=f'{finetune.__file__}:model={config.model_name},'
                     f'dataset=vtab/{task}', overrides={}, grid={'task': [task]},
                     metric='accuracy', x='task', group=None, select=None)
  return sweep, spec.Run(TRIALS, (('task', task),), tuple(merged.items()))


def _finished(directory: str, run) -> Optional[float]:
  """The top-1 of a trial that finished with these settings; None if it has not finished; a
  UserError if it finished with others (its folder would mix two settings)."""
  from vit_jax.tools.sweeps import runner  # pylint: disable=g-import-not-at-top
  result = runner.read_result(directory, run)
  if result is None:
    return None
  if result.get('overrides') != json.loads(json.dumps(dict(run.overrides))):
    raise UserError(f'{runner.run_dir(directory, run)} holds a VTAB fine-tune with other settings '
                    f'({result.get("overrides")}): move it away, or evaluate with those settings')
  return float(result['metric'])


def fine_tune(config, init: str, directory: str, tasks: str = 'all', overrides: str = '',
              launcher: str = 'process',
              say: Callable[[str], None] = print) -> Dict[str, float]:
  """{task: top-1} of the fine-tunes of `init` on `tasks`, trained (or resumed) where they have
  not finished, in `directory`/vtab/. Every task's dataset is checked before the first trains;
  a signal stops the running trainer (KeyboardInterrupt once it has saved)."""
  from vit_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import runner  # pylint: disable=g-import-not-at-top
  root = os.path.join(directory, TRIALS)
  pairs = parse_overrides(overrides)
  trials = {t: trial(t, config, init, pairs) for t in task_names(tasks)}
  top1 = {t: v for t, (_, run) in trials.items()
          if (v := _finished(directory, run)) is not None}
  todo = [t for t in trials if t not in top1]
  for task in todo:  # an unprepared dataset is refused before anything trains
    data_lib.get_info(vtab_data.PREFIX + task, config.get('data_dir'))
  failed = []
  with runner._Trainers() as trainers:  # pylint: disable=protected-access
    for i, task in enumerate(todo):
      sweep, run = trials[task]
      workdir = runner.run_dir(directory, run)
      say(f'vtab: fine-tuning {task} ({i + 1}/{len(todo)} to train) in {workdir}')
      outcome = runner.run_one(sweep, run, workdir, launcher, trainers)
      if outcome.status == 'stopped' or trainers.stopping:
        raise KeyboardInterrupt
      if outcome.status != 'done':
        failed.append(f'{task} ({outcome.error})')
        continue
      top1[task] = outcome.metric
      say(f'vtab: {task} top-1 {outcome.metric:.4f}')
  if failed:
    raise UserError(f'VTAB fine-tune(s) failed: {"; ".join(failed)}; see their log.txt in {root}, '
                    f'fix, and rerun the same command (finished tasks are kept)')
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, 'table.md'), 'w') as f:
    f.write(vtab_data.table(top1))
  return top1


def metrics(top1: Dict[str, float]) -> Dict[str, float]:
  """The table's metrics: each task's top-1 in the paper's group order, then the group means
  and the mean over the 19 where all their tasks ran."""
  from vit_jax.data.sources import vtab as vtab_data  # pylint: disable=g-import-not-at-top
  ordered = [t for group in vtab_data.GROUPS.values() for t in group if t in top1]
  return {**{t: top1[t] for t in ordered}, **vtab_data.aggregate(top1)}


__all__ = ['KEPT_MODEL_OPTIONS', 'LAUNCHERS', 'TRIALS', 'check_options', 'fine_tune', 'metrics',
           'parse_overrides', 'recipe_config', 'task_names', 'trial']
