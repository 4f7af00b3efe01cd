"""Hyperparameter sweeps: `run_sweep(spec_path, workdir)` (CLI: `python -m vit_jax.sweep`).

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
  """Runs (or, with dry_run, prints) a sweep; returns the summary written to best.json."""
  import os  # pylint: disable=g-import-not-at-top
  sweep = load(spec_path)
  os.makedirs(workdir, exist_ok=True)
  grid = sweep.grid_runs()
  grid_outcomes = runner.execute(sweep, grid, workdir, launcher=launcher, parallel=parallel,
                                 dry_run=dry_run, say=say)
  if dry_run:
    if sweep.select:
      say(f'then {len(sweep.grid.get(spec_lib.SEED, [None]))} final run(s) of the best setting'
          + (f' per {sweep.group}' if sweep.group else '') + f' with {sweep.select.get("final")}')
    return {'planned': [r.name for r in grid]}
  best = report.best_settings(report.aggregate(grid_outcomes), sweep.group)
  final_outcomes = []
  if sweep.select and best:
    final_outcomes = runner.execute(sweep, sweep.final_runs(best), workdir, launcher=launcher,
                                    parallel=parallel, say=say)
  summary = report.write(workdir, sweep, grid_outcomes, final_outcomes, best)
  summary['failed'] = [o.run.name for o in grid_outcomes + final_outcomes if o.status == 'failed']
  return summary


__all__ = ['run_sweep', 'load', 'Run', 'Sweep', 'report', 'runner']
