"""Named training runs trained one after the other as a sweep trains its runs (runner.py), for a
caller below the trainer that needs runs trained: the `evaluate` command's VTAB fine-tunes.

  run_trials({name: Trial}, directory, launcher=..., say=..., before=...) -> {name: metric}

Each trial trains in `<directory>/<folder>/<key>_<name>/` (the trainer in its own process, or
in this one with launcher='inline'). One that finished (its sweep_result.json, with the same
overrides) is read back, not trained again; an unfinished one resumes from its checkpoint. A
SIGTERM or Ctrl-C reaches the running trainer, which saves a checkpoint; then KeyboardInterrupt
is raised.
"""

import dataclasses
import json
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from vit_jax.errors import UserError
from vit_jax.tools.sweeps import runner
from vit_jax.tools.sweeps import spec


@dataclasses.dataclass(frozen=True)
class Trial:
  """One training run: its --config value, its --config.KEY=VALUE overrides, the folder its
  run lives in (`<folder>/<key>_<name>`, as a sweep names a run by its swept key and value),
  and the metric of its last eval record that is its result."""
  config: str
  overrides: Tuple[Tuple[str, Any], ...]
  folder: str
  key: str = 'run'
  metric: str = 'accuracy'


def sweep_run(name: str, trial: Trial) -> Tuple[spec.Sweep, spec.Run]:
  """The trial as the sweep runner takes it; its workdir is
  `<directory>/<folder>/<key>_<name>`."""
  sweep = spec.Sweep(path='', config=trial.config, overrides={}, grid={trial.key: [name]},
                     metric=trial.metric, x=trial.key, group=None, select=None)
  return sweep, spec.Run(trial.folder, ((trial.key, name),), trial.overrides)


def finished(directory: str, name: str, trial: Trial) -> Optional[float]:
  """The metric of a trial that finished with these overrides; None if it has not finished; a
  UserError if its folder holds a run with other overrides (it would mix two settings)."""
  _, run = sweep_run(name, trial)
  result = runner.read_result(directory, run)
  if result is None:
    return None
  if result.get('overrides') != json.loads(json.dumps(dict(run.overrides))):
    raise UserError(f'{runner.run_dir(directory, run)} holds a run with other settings '
                    f'({result.get("overrides")}): move it away, or use those settings')
  return float(result['metric'])


def run_trials(trials: Dict[str, Any], directory: str, *, launcher: str = 'process',
               say: Callable[[str], None] = print,
               before: Callable[[Sequence[str]], None] = lambda names: None) -> Dict[str, float]:
  """{name: metric} of every trial (a `Trial`, or a dict of its fields), training those that
  have not finished in order, after `before(names to train)` (a check that raises before
  anything trains). A trial that fails
  does not stop the others; then UserError names each with its error."""
  runner.check_launch(launcher, 1)
  trials = {n: t if isinstance(t, Trial) else Trial(**t) for n, t in trials.items()}
  out = {}
  for name, trial in trials.items():
    value = finished(directory, name, trial)
    if value is not None:
      out[name] = value
  todo = [name for name in trials if name not in out]
  before(todo)
  failed = []
  with runner._Trainers() as trainers:  # pylint: disable=protected-access
    for i, name in enumerate(todo):
      sweep, run = sweep_run(name, trials[name])
      workdir = runner.run_dir(directory, run)
      say(f'training {name} ({i + 1}/{len(todo)}) in {workdir}')
      outcome = runner.run_one(sweep, run, workdir, launcher, trainers)
      if outcome.status == 'stopped' or trainers.stopping:
        raise KeyboardInterrupt
      if outcome.status != 'done':
        failed.append(f'{name} ({outcome.error})')
        continue
      out[name] = outcome.metric
      say(f'{name}: {trials[name].metric} {outcome.metric:.4f}')
  if failed:
    raise UserError(f'{len(failed)} run(s) failed: {"; ".join(failed)}; see their log.txt in '
                    f'{directory}, fix, and rerun the same command (finished runs are kept)')
  return out


__all__ = ['Trial', 'finished', 'run_trials', 'sweep_run']
