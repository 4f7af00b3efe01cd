"""Hyperparameter sweeps: `run_sweep(spec_path, workdir)` (CLI: `python -m vit_jax sweep`).

spec (spec.py) -> grid runs, each in its own sub-workdir (runner.py; finished runs skipped) ->
settings averaged over seeds, the best one (per group) chosen on the grid's eval split, which is
a dev split when the spec says so -> final runs of the best -> tables and a plot (report.py).
"""

from typing import Callable

from vit_jax.sweeps import report
from vit_jax.sweeps import runner
from vit_jax.sweeps import spec as spec_lib
from vit_jax.sweeps.spec import Run, Sweep, load


def run_sweep(spec_path: str, workdir: str, *, launcher: str = 'process', parallel: int = 1,
              dry_run: bool = False, say: Callable[[str], None] = print) -> dict:
  """Runs (or, with dry_run, prints) a sweep; returns the summary written to best.json, or
  {'stopped': [run names]} when a signal stopped it (rerunning the same command resumes)."""
  import os  # pylint: disable=g-import-not-at-top
  runner.check_launch(launcher, parallel)
  sweep = load(spec_path)
  if dry_run:
    return _plan(sweep, workdir, say)
  from vit_jax.train import lock as lock_lib  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  held = lock_lib.WorkdirLock(workdir).acquire()  # one sweep per directory
  try:
    grid_outcomes = runner.execute(sweep, sweep.grid_runs(), workdir, launcher=launcher,
                                   parallel=parallel, say=say)
    final_outcomes = []
    best = report.best_settings(report.aggregate(grid_outcomes), sweep.group)
    if sweep.select and best and not _stopped(grid_outcomes):
      final_outcomes = runner.execute(sweep, sweep.final_runs(best), workdir, launcher=launcher,
                                      parallel=parallel, say=say)
    if _stopped(grid_outcomes + final_outcomes):
      return {'stopped': _stopped(grid_outcomes + final_outcomes)}
    summary = report.write(workdir, sweep, grid_outcomes, final_outcomes, best)
  finally:
    held.release()
  summary['failed'] = [o.run.name for o in grid_outcomes + final_outcomes if o.status == 'failed']
  return summary


def _stopped(outcomes) -> list:
  return [o.run.name for o in outcomes if o.status == 'stopped']


def _plan(sweep, workdir: str, say) -> dict:
  grid = sweep.grid_runs()
  runner.execute(sweep, grid, workdir, dry_run=True, say=say)
  if sweep.select:
    say(f'then {len(sweep.grid.get(spec_lib.SEED, [None]))} final run(s) of the best setting'
        + (f' per {sweep.group}' if sweep.group else '') + f' with {sweep.select.get("final")}')
  return {'planned': [r.name for r in grid]}


__all__ = ['run_sweep', 'load', 'Run', 'Sweep', 'report', 'runner']
