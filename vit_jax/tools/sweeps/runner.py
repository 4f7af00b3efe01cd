"""Running one run of a sweep in `<workdir>/<phase>/<name>/` (the study decides which: worker.py).

A run goes through `python -m vit_jax.main` (the train command) in a subprocess
(`launcher='process'`, output in the run's `log.txt`), or in this process (`'inline'`); an
unfinished run resumes from its own checkpoint (the trainer's resume). A finished run writes
`sweep_result.json` (its metric, time and values), which a dry run reads to list what is left.

Stopping: SIGTERM or SIGINT to the sweep is forwarded to its trainers (each in its own session,
so a terminal's Ctrl-C reaches them only this way, once); they save a checkpoint and exit, the
sweep waits for them, starts no other run, and reports the runs as 'stopped'. A trainer also
gets a SIGTERM when the sweep dies without a word (kill -9): `guards.stop_with_parent`. A run
whose workdir is held by a live trainer (one left running by an earlier sweep, or the trainer of
a killed worker still saving) is waited for up to `lock_wait_s`, then fails with a line naming
that trainer. A pruned run is stopped the same way (SIGTERM; inline: the same signal to this
process, which the trainer takes as a preemption) and keeps its checkpoint.
"""

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional

from vit_jax.errors import UserError
from vit_jax.fileio import files_for, is_remote
from vit_jax.tools.sweeps.spec import Run, Sweep

RESULT = 'sweep_result.json'
POLL_S = 0.5      # how often a running trainer's metrics are read
LOCK_WAIT_S = 120  # how long a run waits for its workdir's lock (a killed worker's trainer saving)
LAUNCHERS = ('process', 'inline')


@dataclasses.dataclass
class Outcome:
  run: Run
  status: str                     # done | pruned | failed | stopped | planned
  metric: Optional[float] = None  # pruned: the metric of the evaluation it was pruned after
  seconds: Optional[float] = None
  error: Optional[str] = None
  step: Optional[int] = None      # pruned: the step of that evaluation


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
  """The run's `sweep_result.json`; None when it has none, or one that a kill cut short."""
  path = os.path.join(run_dir(root, run), RESULT)
  if not files_for(path).exists(path):
    return None
  with files_for(path).GFile(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError:  # cut short by a kill before writes were atomic: run it again
    return None


def write_result(workdir: str, run: Run, metric: float, seconds: float, step: int) -> None:
  """A finished run's `sweep_result.json`, written whole (a temporary file renamed): a sweep killed
  while writing it leaves no partial result behind."""
  # pylint: disable-next=g-import-not-at-top  (vit_jax.formats imports JAX; a sweep reads without)
  from vit_jax.formats.files import atomic_write
  result = json.dumps({'metric': metric, 'seconds': seconds, 'step': step,
                       'values': dict(run.values), 'overrides': dict(run.overrides)}, indent=1)
  atomic_write(os.path.join(workdir, RESULT), lambda f: f.write(result.encode()))


def log_path(workdir: str) -> str:
  """Where a run's trainer output goes: `<run workdir>/log.txt`; for a bucket, a local file
  (copied to the bucket after each attempt), since a subprocess writes to a local file."""
  if not is_remote(workdir):
    return os.path.join(workdir, 'log.txt')
  import hashlib  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  key = hashlib.sha1(workdir.encode()).hexdigest()[:16]
  return os.path.join(tempfile.gettempdir(), 'vit_jax_sweep_logs', key, 'log.txt')


def final_eval(run_workdir: str) -> Optional[dict]:
  """The last 'eval' record of a run's metrics.jsonl."""
  from vit_jax.run import logs  # pylint: disable=g-import-not-at-top
  records = logs.read_metrics(os.path.join(run_workdir, 'metrics.jsonl'))
  evals = [r for r in records if r['split'] == 'eval']
  return evals[-1] if evals else None


def check_launch(launcher: str, parallel: int) -> None:
  if launcher not in LAUNCHERS:
    raise UserError(f'unknown --launcher={launcher}: use process or inline')
  if parallel < 1:
    raise UserError(f'--parallel={parallel}: the number of runs at once must be at least 1')


def plan(sweep: Sweep, runs: List[Run], root: str, say: Callable[[str], None] = print) -> None:
  """A dry run: the runs finished before (their sweep_result.json), and the commands of the
  others."""
  for i, run in enumerate(runs):
    done = read_result(root, run)
    if done is not None:
      say(f'[{i + 1}/{len(runs)}] {run.name}: finished before ({sweep.metric} '
          f'{done.get("metric")}), skipped')
  for run in runs:
    if read_result(root, run) is None:
      say(' '.join(_quote(a) for a in command(sweep, run, run_dir(root, run))))


class _Trainers:
  """The trainer subprocesses of a sweep: SIGTERM/SIGINT to the sweep are forwarded to them (and
  mark the sweep as stopping); none outlives the sweep's `with` block."""

  def __init__(self):
    self.stopping = False
    self._own_signals = 0  # SIGTERMs this process sent itself to stop an inline run (pruning)
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
    with self._guard:
      if self._own_signals and signum == signal.SIGTERM:  # an inline run's pruning, come late
        self._own_signals -= 1
        return
    self.stopping = True
    for proc in list(self._procs):
      proc.send_signal(signum)

  def stop_inline(self) -> None:
    """Stops the run training in this process (pruning): a SIGTERM to this process, which the
    trainer's preemption handler takes; should it come after the run's end, it is ignored."""
    with self._guard:
      self._own_signals += 1
    os.kill(os.getpid(), signal.SIGTERM)

  def taken_inline(self) -> None:
    with self._guard:
      self._own_signals = max(0, self._own_signals - 1)

  def run(self, argv: List[str], log, poll: Optional[Callable[[], bool]] = None) -> Optional[int]:
    """Runs one trainer to its end; its exit status (None: not started, the sweep stops). While
    it runs, `poll()` is called every POLL_S seconds; once it returns True the trainer gets a
    SIGTERM (it saves a checkpoint and stops)."""
    from vit_jax.run import guards  # pylint: disable=g-import-not-at-top
    with self._guard:
      if self.stopping:
        return None
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                              env=dict(os.environ, **{guards.PARENT_ENV: str(os.getpid())}))
      self._procs.add(proc)
    if self.stopping:  # a signal came while it started
      proc.send_signal(signal.SIGTERM)
    try:
      signalled = False
      while True:
        try:
          return proc.wait(timeout=POLL_S if poll else None)
        except subprocess.TimeoutExpired:
          if not signalled and poll():
            proc.send_signal(signal.SIGTERM)
            signalled = True
    finally:
      self._procs.discard(proc)

  def __exit__(self, *exc):
    for proc in list(self._procs):  # only after an error in the sweep itself
      proc.send_signal(signal.SIGTERM)
      proc.wait()
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def run_one(sweep: Sweep, run: Run, workdir: str, launcher: str, trainers: _Trainers, *,
            reporter=None, lock_wait_s: float = 0.0) -> Outcome:
  """Trains one run to its end (or until `reporter.poll()` says to prune it)."""
  from vit_jax.run import lock  # pylint: disable=g-import-not-at-top
  files_for(workdir).makedirs(workdir)
  holder = lock.holder(workdir)
  deadline = time.monotonic() + lock_wait_s
  while holder is not None and time.monotonic() < deadline and not trainers.stopping:
    time.sleep(POLL_S)
    holder = lock.holder(workdir)
  if holder is not None:
    return Outcome(run, 'failed', error=f'its workdir is in use by {holder.describe()} (a '
                   'trainer left running by an earlier sweep?): wait for it or stop it, then '
                   'rerun the same command')
  start = time.perf_counter()
  poll = reporter.poll if reporter is not None else None
  if launcher == 'process':
    os.makedirs(os.path.dirname(log_path(workdir)), exist_ok=True)
    with open(log_path(workdir), 'a') as log:
      status = trainers.run(command(sweep, run, workdir), log, poll)
    if log_path(workdir) != os.path.join(workdir, 'log.txt'):
      files_for(workdir).copy(log_path(workdir), os.path.join(workdir, 'log.txt'),
                              overwrite=True)
    if status is None:
      return Outcome(run, 'stopped', error='not started: the sweep was stopped')
    preempted = status == 0 and _last_line(workdir).startswith('preempted:')
    error = (f'exit status {status}: {_last_line(workdir)}' if status else
             _last_line(workdir) if preempted else None)
  else:
    error, preempted = _run_inline(sweep, run, workdir, trainers, poll)
  seconds = time.perf_counter() - start
  if reporter is not None and not (error or preempted):
    reporter.poll(ended=True)  # the evaluations not reported yet (the last one is the value)
  if reporter is not None and reporter.pruned is not None:
    step, value = reporter.pruned
    return Outcome(run, 'pruned', value, seconds, step=step)
  if preempted:
    return Outcome(run, 'stopped', error=error)
  if error:
    return Outcome(run, 'failed', error=error)
  record = final_eval(workdir)
  if record is None or sweep.metric not in record:
    return Outcome(run, 'failed', error=f'no eval record with {sweep.metric!r} in metrics.jsonl')
  metric = float(record[sweep.metric])
  write_result(workdir, run, metric, seconds, record['step'])
  return Outcome(run, 'done', metric, seconds)


def _run_inline(sweep: Sweep, run: Run, workdir: str, trainers: _Trainers, poll):
  """(error, preempted) of training in this process; `poll` is watched from a thread."""
  done = threading.Event()

  sent = []

  def watch():
    while not done.wait(POLL_S):
      if poll():
        sent.append(True)
        trainers.stop_inline()
        return

  watcher = threading.Thread(target=watch, name='prune_watch', daemon=True) if poll else None
  if watcher is not None:
    watcher.start()
  preempted, error = False, None
  try:
    preempted = bool(_train_inline(sweep, run, workdir).get('preempted'))
  except UserError as e:
    error = str(e)
  finally:
    done.set()
    if watcher is not None:
      watcher.join()
  if sent and preempted:  # the trainer took the pruning's signal: none is left to come
    trainers.taken_inline()
  return error or ('preempted: its checkpoint is saved' if preempted else None), preempted


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
  with open(log_path(workdir)) as f:
    lines = [l.strip() for l in f.read().splitlines() if l.strip()]
  return lines[-1] if lines else 'no output'


def _quote(arg: str) -> str:
  import shlex  # pylint: disable=g-import-not-at-top
  return shlex.quote(arg)


__all__ = ['Outcome', 'plan', 'run_one', 'check_launch', 'command', 'run_dir', 'read_result',
           'final_eval', 'load_config', 'apply_overrides', 'RESULT', 'LAUNCHERS',
           'write_result']
