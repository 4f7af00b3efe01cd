"""Hyperparameter sweeps: `run_sweep(spec_path, workdir)` (CLI: `python -m vit_jax sweep`).

spec (spec.py) -> an Optuna study (study.py: the grid sampler for a grid, TPE or random for
ranges; storage in the workdir or a shared database) worked through by this process and any
other worker on the same study (worker.py), each run in its own sub-workdir (runner.py), its
evaluations reported to the pruner -> settings averaged over seeds, the best one (per group)
chosen on the search's eval split, which is a dev split when the spec says so -> final runs of
the best (a second study) -> tables and a plot (report.py).
"""

import concurrent.futures
from typing import Callable, Optional

from vit_jax.fileio import files_for
from vit_jax.tools.sweeps import report
from vit_jax.tools.sweeps import runner
from vit_jax.tools.sweeps import spec as spec_lib
from vit_jax.tools.sweeps import study as study_lib
from vit_jax.tools.sweeps import worker
from vit_jax.tools.sweeps.spec import Run, Sweep, load

HEARTBEAT_S = 60


def run_sweep(spec_path: str, workdir: str, *, launcher: str = 'process', parallel: int = 1,
              dry_run: bool = False, say: Callable[[str], None] = print,
              storage: Optional[str] = None, study_name: Optional[str] = None,
              heartbeat_s: int = HEARTBEAT_S, lock_wait_s: float = runner.LOCK_WAIT_S) -> dict:
  """Runs (or, with dry_run, prints) a sweep; returns the summary written to best.json, or
  {'stopped': [run names]} when a signal stopped it (rerunning the same command resumes).

  Without `storage` the study is the file study.db in `workdir` and this is the directory's one
  sweep process (it holds the directory's lock); with a database URL, any number of processes
  (on any machines) running the same command work through the same study together."""
  runner.check_launch(launcher, parallel)
  sweep = load(spec_path)
  if dry_run:
    return _plan(sweep, workdir, say)
  if heartbeat_s < 1:
    from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
    raise UserError(f'--heartbeat={heartbeat_s}: a running trial beats every N >= 1 seconds')
  from vit_jax.run import lock as lock_lib  # pylint: disable=g-import-not-at-top
  url = study_lib.storage_url(workdir, storage)
  exclusive = storage is None
  files_for(workdir).makedirs(workdir)
  held = lock_lib.WorkdirLock(workdir).acquire() if exclusive else None  # one sweep per dir
  try:
    store = study_lib.open_storage(url, heartbeat_s)
    name = study_name or study_lib.default_name(workdir)
    work = dict(launcher=launcher, parallel=parallel, heartbeat_s=heartbeat_s,
                lock_wait_s=lock_wait_s, say=say, exclusive=exclusive)
    with runner._Trainers() as trainers:  # pylint: disable=protected-access
      grid = worker.Phase(sweep, study_lib.open_study(store, name, sweep),
                          sweep.grid_runs() or None)
      grid_outcomes = _phase(grid, workdir, store, trainers, **work)
      final_outcomes = []
      best = report.best_settings(report.aggregate(grid_outcomes), sweep.group)
      if sweep.select and best and not _stopped(grid_outcomes):
        runs = sweep.final_runs(best)
        final = worker.Phase(sweep, study_lib.open_study(store, name, sweep, runs), runs,
                             final=True)
        final_outcomes = _phase(final, workdir, store, trainers, **work)
    if _stopped(grid_outcomes + final_outcomes):
      return {'stopped': _stopped(grid_outcomes + final_outcomes)}
    summary = report.write(workdir, sweep, grid_outcomes, final_outcomes, best)
  finally:
    if held is not None:
      held.release()
  summary['failed'] = [o.run.name for o in grid_outcomes + final_outcomes if o.status == 'failed']
  return summary


def _phase(phase, root, store, trainers, *, launcher, parallel, heartbeat_s, lock_wait_s, say,
           exclusive):
  worker.prepare(phase, root, store, exclusive=exclusive)
  worker.finished_before(phase, say)
  work = lambda: worker.work(phase, root, store, launcher=launcher, trainers=trainers,
                             heartbeat_s=heartbeat_s, lock_wait_s=lock_wait_s, say=say)
  if launcher == 'inline' or parallel <= 1:  # inline runs stay in the main thread (signals)
    work()
  else:
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
      for future in [pool.submit(work) for _ in range(parallel)]:
        future.result()
  return worker.outcomes(phase, stopping=trainers.stopping)


def _stopped(outcomes) -> list:
  return [o.run.name for o in outcomes if o.status == 'stopped']


def _plan(sweep, workdir: str, say) -> dict:
  grid = sweep.grid_runs()
  if sweep.ranges:
    say(f'{sweep.trials} run(s) sampled ({sweep.sampler}) from ' + ', '.join(
        f'{k} in [{r["low"]}, {r["high"]}]' + (' (log)' if r['log'] else '')
        for k, r in sweep.ranges.items()) + ''.join(f', {k} in {v}' for k, v in sweep.grid.items()))
  runner.plan(sweep, grid, workdir, say=say)
  if sweep.select:
    say(f'then {len(sweep.grid.get(spec_lib.SEED, [None]))} final run(s) of the best setting'
        + (f' per {sweep.group}' if sweep.group else '') + f' with {sweep.select.get("final")}')
  return {'planned': [r.name for r in grid]}


__all__ = ['run_sweep', 'load', 'Run', 'Sweep', 'report', 'runner', 'worker']
