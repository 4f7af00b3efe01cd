"""Running a sweep: each run in `<workdir>/<phase>/<name>/`, finished runs skipped.

A run is finished when its `sweep_result.json` exists (written after the trainer returned), so a
killed sweep rerun with the same command skips them; an unfinished run resumes from its own
checkpoint (the trainer's resume). Runs go through `python -m vit_jax.main` (the train command) in
a subprocess (`launcher='process'`, output in the run's `log.txt`), or in this process (`'inline'`).

Stopping: SIGTERM or SIGINT to the sweep is forwarded to its trainers (each in its own session,
so a terminal's Ctrl-C reaches them only this way, once); they save a checkpoint and exit, the
sweep waits for them, starts no other run, and reports the runs as 'stopped'. A trainer also
gets a SIGTERM when the sweep dies without a word (kill -9): `guards.stop_with_parent`. A run
whose workdir is held by a live trainer (one left running by an earlier sweep) is not started
a second time: it fails with a line naming that trainer.
"""

import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from vit_jax.errors import UserError
from vit_jax.sweeps.spec import Run, Sweep

RESULT = 'sweep_result.json'
LAUNCHERS = ('process', 'inline')


@dataclasses.dataclass
class Outcome:
  run: Run
  status: str                     # done | skipped (done before) | failed | stopped
  metric: Optional[float] = None
  seconds: Optional[float] = None
  error: Optional[str] = None


def command(sweep: Sweep, run: Run, workdir: str) -> List[str]:
  """The `vit_jax.main` command line of one run (argument list, no shell)."""
  args = [sys.executable, '-m', 'vit_jax.main', f'--config={sweep.config}',
          f'--workdir={workdir}']
  return args + [f'--config.{k}={_flag_value(v)}' for k, v in run.overrides]


def _flag_value(value) -> str:
  if isinstance(value, (list, tuple)):
    return '(' + ','.join(_flag_value(v) for v in value) + (',)' if len(value) == 1 else ')')
  return str(value)


def run_dir(root: str, run: Run) -> str:
  return os.path.join(root, run.name)


def read_result(root: str, run: Run) -> Optional[dict]:
  path = os.path.join(run_dir(root, run), RESULT)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def final_eval(run_workdir: str) -> Optional[dict]:
  """The last 'eval' record of a run's metrics.jsonl."""
  from vit_jax.train import logs  # pylint: disable=g-import-not-at-top
  records = logs.read_metrics(os.path.join(run_workdir, 'metrics.jsonl'))
  evals = [r for r in records if r['split'] == 'eval']
  return evals[-1] if evals else None


def check_launch(launcher: str, parallel: int) -> None:
  if launcher not in LAUNCHERS:
    raise UserError(f'unknown --launcher={launcher}: use process or inline')
  if parallel < 1:
    raise UserError(f'--parallel={parallel}: the number of runs at once must be at least 1')


def execute(sweep: Sweep, runs: List[Run], root: str, *, launcher: str = 'process',
            parallel: int = 1, dry_run: bool = False,
            say: Callable[[str], None] = print) -> List[Outcome]:
  """Runs what is not finished yet; returns one Outcome per run, in order."""
  check_launch(launcher, parallel)
  outcomes: Dict[int, Outcome] = {}
  todo = []
  for i, run in enumerate(runs):
    done = read_result(root, run)
    if done is not None:
      outcomes[i] = Outcome(run, 'skipped', done.get('metric'), done.get('seconds'))
      say(f'[{i + 1}/{len(runs)}] {run.name}: finished before ({sweep.metric} '
          f'{done.get("metric")}), skipped')
    else:
      todo.append(i)
  if dry_run:
    for i in todo:
      say(' '.join(_quote(a) for a in command(sweep, runs[i], run_dir(root, runs[i]))))
    return [outcomes[i] if i in outcomes else Outcome(runs[i], 'planned') for i in
            range(len(runs))]

  with _Trainers() as trainers:
    def one(i):
      run = runs[i]
      if trainers.stopping:
        return i, Outcome(run, 'stopped', error='not started: the sweep was stopped')
      say(f'[{i + 1}/{len(runs)}] {run.name}: running')
      outcome = _run_one(sweep, run, run_dir(root, run), launcher, trainers)
      if outcome.status == 'stopped':
        trainers.stopping = True
      say(f'[{i + 1}/{len(runs)}] {run.name}: {outcome.status}'
          + (f', {sweep.metric} {outcome.metric:.4f} in {outcome.seconds:.0f} s'
             if outcome.status == 'done' else f' ({outcome.error})'))
      return i, outcome

    if launcher == 'inline' or parallel <= 1:  # inline runs stay in the main thread (signals)
      for i in todo:
        outcomes[i] = one(i)[1]
    else:
      with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        for i, outcome in pool.map(one, todo):
          outcomes[i] = outcome
  return [outcomes[i] for i in range(len(runs))]


class _Trainers:
  """The trainer subprocesses of a sweep: SIGTERM/SIGINT to the sweep are forwarded to them (and
  mark the sweep as stopping); none outlives the sweep's `with` block."""

  def __init__(self):
    self.stopping = False
    self._procs = set()
    self._guard = threading.Lock()
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._forward)
    return self

  def _forward(self, signum, frame):
    del frame
    self.stopping = True
    for proc in list(self._procs):
      proc.send_signal(signum)

  def run(self, argv: List[str], log) -> Optional[int]:
    """Runs one trainer to its end; its exit status (None: not started, the sweep stops)."""
    from vit_jax.train import guards  # pylint: disable=g-import-not-at-top
    with self._guard:
      if self.stopping:
        return None
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env=dict(os.environ, **{guards.PARENT_ENV: str(os.getpid())}))
      self._procs.add(proc)
    if self.stopping:  # a signal came while it started
      proc.send_signal(signal.SIGTERM)
    try:
      return proc.wait()
    finally:
      self._procs.discard(proc)

  def __exit__(self, *exc):
    for proc in list(self._procs):  # only after an error in the sweep itself
      proc.send_signal(signal.SIGTERM)
      proc.wait()
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _run_one(sweep: Sweep, run: Run, workdir: str, launcher: str, trainers: _Trainers) -> Outcome:
  from vit_jax.train import lock  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  holder = lock.holder(workdir)
  if holder is not None:
    return Outcome(run, 'failed', error=f'its workdir is in use by {holder.describe()} (a '
                   'trainer left running by an earlier sweep?): wait for it or stop it, then '
                   'rerun the same command')
  start = time.perf_counter()
  if launcher == 'process':
    with open(os.path.join(workdir, 'log.txt'), 'a') as log:
      status = trainers.run(command(sweep, run, workdir), log)
    if status is None:
      return Outcome(run, 'stopped', error='not started: the sweep was stopped')
    if status == 0 and _last_line(workdir).startswith('preempted:'):
      return Outcome(run, 'stopped', error=_last_line(workdir))
    if status:
      return Outcome(run, 'failed', error=f'exit status {status}: {_last_line(workdir)}')
  else:
    try:
      if _train_inline(sweep, run, workdir).get('preempted'):
        return Outcome(run, 'stopped', error='preempted: its checkpoint is saved')
    except UserError as e:
      return Outcome(run, 'failed', error=str(e))
  seconds = time.perf_counter() - start
  record = final_eval(workdir)
  if record is None or sweep.metric not in record:
    return Outcome(run, 'failed', error=f'no eval record with {sweep.metric!r} in metrics.jsonl')
  metric = float(record[sweep.metric])
  with open(os.path.join(workdir, RESULT), 'w') as f:
    json.dump({'metric': metric, 'seconds': seconds, 'step': record['step'],
               'values': dict(run.values), 'overrides': dict(run.overrides)}, f, indent=1)
  return Outcome(run, 'done', metric, seconds)


def load_config(config_arg: str):
  """The ConfigDict of a --config value 'path.py[:args]' (as config_flags would load it)."""
  path, _, arg = config_arg.partition(':')
  module_spec = importlib.util.spec_from_file_location('_sweep_config', path)
  if module_spec is None or not os.path.isfile(path):
    raise UserError(f'the sweep\'s config file {path} does not exist')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*([arg] if arg else []))


def apply_overrides(config, overrides) -> None:
  for key, value in overrides:
    node = config
    *parents, leaf = key.split('.')
    for parent in parents:
      node = node[parent]
    if leaf not in node:
      raise UserError(f'unknown config key {key!r} in the sweep: every key is listed in '
                      f'configs/README.md')
    node[leaf] = value


def _train_inline(sweep: Sweep, run: Run, workdir: str) -> dict:
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  config = load_config(sweep.config)
  apply_overrides(config, run.overrides)
  config.lock()
  return loop.train_and_evaluate(config, workdir)


def _last_line(workdir: str) -> str:
  with open(os.path.join(workdir, 'log.txt')) as f:
    lines = [l.strip() for l in f.read().splitlines() if l.strip()]
  return lines[-1] if lines else 'no output'


def _quote(arg: str) -> str:
  import shlex  # pylint: disable=g-import-not-at-top
  return shlex.quote(arg)


__all__ = ['Outcome', 'execute', 'check_launch', 'command', 'run_dir', 'read_result', 'final_eval',
           'load_config', 'apply_overrides', 'RESULT', 'LAUNCHERS']
