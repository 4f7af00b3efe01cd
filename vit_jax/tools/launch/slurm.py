"""SLURM clusters: one batch job runs the command as one task per GPU (or per node), requeued
with a checkpoint when its time limit nears.

  python -m vit_jax launch --slurm --nodes=2 --gpus_per_node=8 --time=24:00:00 -- \
      python -m vit_jax.main --config=... --workdir=/shared/runs/b16
  python -m vit_jax launch --slurm --status     # state, nodes, the log's last lines
  python -m vit_jax launch --slurm --logs       # the log's last --lines
  python -m vit_jax launch --slurm --stop       # SIGTERM: the trainer saves and exits

The launch directory (`--launch_dir`, on storage the nodes share) holds the job's batch script
`job.sbatch`, its id (`job`) and its log (`log.txt`, appended to by every run of the job). The
script asks for `--signal=B:TERM@LEAD`: SLURM sends SIGTERM to the batch shell LEAD seconds before
the time limit, and the shell passes it to every task (`scancel --signal=TERM`, which reaches the
tasks of the job step, not the shell); the trainer saves a checkpoint and exits, and the shell
then requeues the job (`scontrol requeue`): the same script starts again and the trainer resumes
from that checkpoint. srun itself is not signalled: on SIGTERM it kills its tasks. A `scancel`
also sends SIGTERM to the shell, but the job is no longer RUNNING then: it is not requeued.
`--stop` signals the tasks the same way but not the shell, so the job ends there. Under srun every task
finds the run's process count, its index and the coordinator by itself
(`vit_jax.parallel.init_distributed`).
"""

import dataclasses
import os
import shlex
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

from vit_jax.errors import UserError
from vit_jax.tools.launch import Steps, check_steps, tools

# How SLURM's tools begin the lines that say why they failed ("sbatch: error: ...").
MARKERS = ('error:',)
MISSING = ('this is not a SLURM login node: run launch --slurm where sbatch works, or use '
           '--dry_run and run the printed script and commands there')
# Job states after which the job runs no more (`squeue --states=all`, sacct).
FINISHED = frozenset({'COMPLETED', 'CANCELLED', 'FAILED', 'TIMEOUT', 'NODE_FAIL', 'PREEMPTED',
                      'BOOT_FAIL', 'DEADLINE', 'OUT_OF_MEMORY', 'REVOKED'})
# Job states before its script starts: --stop cancels the job (nothing to save).
WAITING = frozenset({'PENDING', 'REQUEUED', 'REQUEUE_HOLD', 'REQUEUE_FED', 'CONFIGURING',
                     'SUSPENDED', 'SPECIAL_EXIT', 'STOPPED', 'RESV_DEL_HOLD'})
STATUS_FORMAT = '%T|%r|%M|%l|%D|%N'  # state, reason, elapsed, limit, node count, nodes
SACCT_FIELDS = 'State,Elapsed,Timelimit,NNodes,NodeList'
EXIT_USER_ERROR = 2  # the trainer's exit status for a user error (vit_jax.cli): no requeue


@dataclasses.dataclass(frozen=True)
class Job:
  """What the job asks SLURM for."""
  nodes: int = 1
  gpus_per_node: int = 0
  tasks_per_node: Optional[int] = None  # default: one per GPU, or one per node without GPUs
  cpus_per_task: Optional[int] = None
  partition: Optional[str] = None
  account: Optional[str] = None
  time: Optional[str] = None  # SLURM's time format: minutes, MM:SS, HH:MM:SS, D-HH:MM:SS
  qos: Optional[str] = None
  name: str = 'vit_jax'
  signal_lead: int = 120  # seconds before the time limit at which the trainer saves
  options: Sequence[str] = ()  # more sbatch options, each one `--key=value` or `--flag`

  def __post_init__(self):
    for flag, value, least in (('nodes', self.nodes, 1), ('gpus_per_node', self.gpus_per_node, 0),
                               ('tasks_per_node', self.tasks_per_node, 1),
                               ('cpus_per_task', self.cpus_per_task, 1),
                               ('signal_lead', self.signal_lead, 0)):
      if value is not None and value < least:
        raise UserError(f'--{flag}={value}: it must be at least {least}')
    for flag in ('partition', 'account', 'time', 'qos', 'name'):
      value = getattr(self, flag)
      if value is not None and (not value or any(c.isspace() for c in value)):
        flag = 'job_name' if flag == 'name' else flag
        raise UserError(f'--{flag}={value!r}: give one word without blanks')
    if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
      raise UserError(f'--tasks_per_node={self.tasks_per_node} with --gpus_per_node='
                      f'{self.gpus_per_node}: under srun each JAX process takes the one GPU its '
                      'SLURM_LOCALID numbers, so run one task per GPU (leave --tasks_per_node out)')
    for option in self.options:
      if not option.startswith('--') or '\n' in option:
        raise UserError(f'--sbatch_option={option!r} is not an sbatch option: give one like '
                        '--constraint=a100 (one per --sbatch_option)')

  @property
  def tasks(self) -> int:
    """Tasks per node: JAX on GPUs runs one process per GPU (each picks its GPU by
    SLURM_LOCALID); on CPUs one process per node uses all of the node's cores."""
    return self.tasks_per_node or max(self.gpus_per_node, 1)


class Place:
  """Where the job's files are (`launch_dir`), where its command runs (`chdir`) and the venv whose
  python it uses (first on PATH)."""

  def __init__(self, launch_dir: str, chdir: str, venv: Optional[str]):
    self.launch_dir = os.path.abspath(os.path.expanduser(launch_dir))
    self.chdir = os.path.abspath(chdir)
    self.venv = venv and os.path.abspath(os.path.expanduser(venv))
    self.script = os.path.join(self.launch_dir, 'job.sbatch')
    self.log = os.path.join(self.launch_dir, 'log.txt')
    self.job_file = os.path.join(self.launch_dir, 'job')

  def job_id(self) -> Optional[str]:
    """The id of the job launched from here last, or None."""
    try:
      with open(self.job_file) as f:
        return f.read().strip() or None
    except FileNotFoundError:
      return None
    except OSError as e:
      raise UserError(f'cannot read {self.job_file} ({e.strerror}): pass the --launch_dir the job '
                      'was launched with') from None


def current_venv() -> Optional[str]:
  """The venv of the Python running this (`make install`'s .venv), or None outside a venv."""
  return sys.prefix if sys.prefix != sys.base_prefix else None


def directives(job: Job, place: Place) -> List[str]:
  """The job's sbatch options, as the script's `#SBATCH` lines give them."""
  out = [f'--job-name={job.name}', f'--nodes={job.nodes}', f'--ntasks-per-node={job.tasks}']
  if job.gpus_per_node:
    out.append(f'--gpus-per-node={job.gpus_per_node}')  # every task of a node sees its GPUs
  for flag in ('cpus_per_task', 'partition', 'account', 'time', 'qos'):
    value = getattr(job, flag)
    if value is not None:
      out.append(f'--{flag.replace("_", "-")}={value}')
  if job.signal_lead:
    out.append(f'--signal=B:TERM@{job.signal_lead}')
  out += ['--requeue', f'--output={place.log}', '--open-mode=append', f'--chdir={place.chdir}',
          *job.options]
  return out


def batch_script(job: Job, place: Place, command: Sequence[str]) -> str:
  """The batch script: the header of each run in the log, the venv first on PATH, the command
  under srun (one process per task), SLURM's warning passed to the tasks, and the requeue."""
  if not command:
    raise UserError('no command to run: put it after --, e.g. -- python -m vit_jax.main '
                    '--config=... --workdir=/shared/runs/NAME')
  lines = ['#!/bin/bash',
           '# Written by `python -m vit_jax launch --slurm` (vit_jax/tools/launch/slurm.py).',
           *(f'#SBATCH {d}' for d in directives(job, place)),
           '',
           '# SLURM warns this shell before the time limit (or a preemption) with SIGTERM: every',
           '# task gets it too (scancel signals the job step, not this shell; a SIGTERM to srun',
           '# would kill its tasks). The trainer saves a checkpoint and exits; the job is then',
           '# requeued. A job being cancelled (scancel) is no longer RUNNING when its SIGTERM',
           '# comes: it is not requeued.',
           'warned=0',
           'warn() {',
           '  [ "$warned" != 0 ] && return',
           '  if [ "$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%T 2>/dev/null)" != '
           'RUNNING ]; then',
           '    warned=cancelled',
           '    echo "== SIGTERM: job $SLURM_JOB_ID is cancelled; it is not requeued"',
           '    return',
           '  fi',
           '  warned=1',
           '  echo "== SIGTERM from SLURM: the tasks save a checkpoint and stop; then the job is '
           'requeued"',
           '  scancel --signal=TERM "$SLURM_JOB_ID"',
           '}',
           'trap warn TERM',
           'echo "== job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}: $SLURM_NTASKS tasks on '
           '$SLURM_JOB_NODELIST, $(date \'+%Y-%m-%d %H:%M:%S\')"']
  if place.venv:
    lines.append(f'export PATH={shlex.quote(os.path.join(place.venv, "bin"))}:"$PATH"')
  if job.cpus_per_task:  # srun does not take it from sbatch (SLURM 22.05 and later)
    lines.append(f'export SRUN_CPUS_PER_TASK={job.cpus_per_task}')
  lines += [
      f'srun --kill-on-bad-exit=1 {shlex.join(command)} &',
      'step=$!',
      'while :; do',  # `wait` returns early when the trap runs; wait again until srun ends
      '  wait "$step"; status=$?',
      '  kill -0 "$step" 2>/dev/null || break',
      'done',
      f'if [ "$warned" = 1 ] && [ "$status" != {EXIT_USER_ERROR} ]; then',
      '  echo "== requeueing job $SLURM_JOB_ID: its next run resumes from the checkpoint"',
      '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
      '  echo "== scontrol requeue failed: launch the same command again to resume"',
      'fi',
      'exit "$status"',
      '']
  return '\n'.join(lines)


def submit_command(place: Place) -> List[str]:
  return ['sbatch', '--parsable', place.script]


def squeue_command(job_id: str) -> List[str]:
  return ['squeue', '--noheader', '--states=all', f'--jobs={job_id}', f'--format={STATUS_FORMAT}']


def sacct_command(job_id: str) -> List[str]:
  return ['sacct', '--noheader', '--parsable2', '--allocations', f'--jobs={job_id}',
          f'--format={SACCT_FIELDS}']


def signal_command(job_id: str) -> List[str]:
  """SIGTERM to the job's tasks (its steps), not to its batch shell: no requeue follows."""
  return ['scancel', '--signal=TERM', job_id]


def cancel_command(job_id: str) -> List[str]:
  return ['scancel', job_id]


@dataclasses.dataclass(frozen=True)
class State:
  """A job's state as squeue (or sacct) reports it."""
  name: str  # RUNNING, PENDING, COMPLETED, ...
  line: str  # the state in words: 'RUNNING, 0:42 of 2:00, 1 node (vm)'

  @property
  def finished(self) -> bool:
    return self.name in FINISHED

  @property
  def waiting(self) -> bool:
    return self.name in WAITING


def parse_squeue(text: str) -> Optional[State]:
  """The State in squeue's STATUS_FORMAT output, or None when it lists no job."""
  rows = [line.split('|') for line in text.splitlines() if line.count('|') == 5]
  if not rows:
    return None
  state, reason, elapsed, limit, count, nodes = (f.strip() for f in rows[0])
  words = state
  if reason and reason not in ('None', 'none') and state in WAITING:
    words += f' ({reason})'
  words += f', {elapsed} of {limit}'
  if nodes and state not in WAITING:
    words += f', {count} node{"s" if count != "1" else ""} ({nodes})'
  return State(state.split()[0], words)


def parse_sacct(text: str) -> Optional[State]:
  """The State in sacct's SACCT_FIELDS output, or None when it lists no job."""
  rows = [line.split('|') for line in text.splitlines() if line.count('|') == 4]
  if not rows:
    return None
  state, elapsed, limit, count, nodes = (f.strip() for f in rows[0])
  name = state.split()[0] if state else 'UNKNOWN'  # "CANCELLED by 0"
  return State(name, f'{state}, {elapsed} of {limit}, {count} node(s) ({nodes}) (sacct)')


def _call(command: List[str], capture: bool = True) -> str:
  return tools.call(command, capture=capture, markers=MARKERS, missing=MISSING)


def job_state(job_id: str) -> State:
  """The job's state from squeue (which knows recent jobs, finished ones too), else sacct."""
  try:
    found = parse_squeue(_call(squeue_command(job_id)))
  except UserError as e:
    if 'Invalid job id' not in str(e):  # squeue's answer for a job it no longer knows
      raise
    found = None
  if found is not None:
    return found
  try:
    found = parse_sacct(_call(sacct_command(job_id)))
  except UserError as e:
    return State('UNKNOWN', f'no longer known to squeue, and sacct cannot say how it ended ({e})')
  return found or State('UNKNOWN', 'known to neither squeue nor sacct')


def _tail(path: str, lines: int) -> Tuple[bool, List[str]]:
  try:
    with open(path, errors='replace') as f:
      return True, f.read().splitlines()[-lines:] if lines > 0 else []
  except FileNotFoundError:
    return False, []
  except OSError as e:
    raise UserError(f'cannot read {path} ({e.strerror})') from None


def run(job: Job, place: Place, steps: Steps, *, dry_run: bool = False,
        say: Callable[[str], None] = print, poll_s: float = 1.0) -> None:
  """Runs (or, with dry_run, prints) the steps in order: stop, submit, status, logs."""
  if steps.sync or steps.setup:
    raise UserError('--sync and --setup are for Cloud TPU VMs: on a SLURM cluster the nodes '
                    'share the checkout; make install there once')
  check_steps(steps, '--status, --logs or --stop', 'the job')
  if steps.stop:
    _stop(place, steps.stop_timeout, dry_run, say, poll_s)
  if steps.command:
    _submit(job, place, steps.command, dry_run, say)
  if steps.status:
    _status(place, steps.lines, dry_run, say)
  if steps.logs:
    _logs(place, steps.lines, dry_run, say)


def _job_or_placeholder(place: Place, dry_run: bool) -> Optional[str]:
  job_id = place.job_id()
  if job_id is None and dry_run:
    return 'JOBID'
  return job_id


def _submit(job: Job, place: Place, command: Sequence[str], dry_run: bool, say) -> None:
  script = batch_script(job, place, command)
  if dry_run:
    say(f'# {place.script}:')
    for line in script.splitlines():
      say(line)
    say(f'mkdir -p {shlex.quote(place.launch_dir)}')
    say(shlex.join(submit_command(place)) + f' > {shlex.quote(place.job_file)}')
    return
  previous = place.job_id()
  if previous is not None:
    state = job_state(previous)
    if not state.finished and state.name != 'UNKNOWN':
      raise UserError(f'job {previous} launched from {place.launch_dir} is {state.name}: stop it '
                      f'first (launch --slurm --stop), or pass another --launch_dir')
  try:
    os.makedirs(place.launch_dir, exist_ok=True)
    with open(place.script, 'w') as f:
      f.write(script)
  except OSError as e:
    raise UserError(f'cannot write {place.script} ({e.strerror}): pass a writable --launch_dir '
                    'on storage the nodes share') from None
  job_id = _call(submit_command(place)).strip().split(';')[0]  # --parsable: ID[;CLUSTER]
  if not job_id.isdigit():
    raise UserError(f'sbatch answered {job_id!r}, not a job id: see {place.script}')
  with open(place.job_file, 'w') as f:
    f.write(job_id + '\n')
  say(f'submitted job {job_id}: {place.script}, log {place.log}')


def _status(place: Place, lines: int, dry_run: bool, say) -> None:
  job_id = _job_or_placeholder(place, dry_run)
  if dry_run:
    say(shlex.join(squeue_command(job_id)) + f'   # else {shlex.join(sacct_command(job_id))}')
    say(f'tail -n {int(lines)} {shlex.quote(place.log)}')
    return
  if job_id is None:
    say(f'no job: nothing was launched from {place.launch_dir}')
    return
  say(f'job {job_id}: {job_state(job_id).line}')
  _logs(place, lines, dry_run, say)


def _logs(place: Place, lines: int, dry_run: bool, say) -> None:
  if dry_run:
    say(f'tail -n {int(lines)} {shlex.quote(place.log)}')
    return
  found, tail = _tail(place.log, lines)
  say(f'== {place.log}' if found else f'(no log yet: {place.log})')
  for line in tail:
    say(line)


def _stop(place: Place, timeout_s: int, dry_run: bool, say, poll_s: float) -> None:
  job_id = _job_or_placeholder(place, dry_run)
  if dry_run:
    say(shlex.join(squeue_command(job_id)))
    say(shlex.join(signal_command(job_id)) + '   # running: the trainer saves and exits')
    say(shlex.join(cancel_command(job_id)) + f'   # not started, or still running '
        f'{int(timeout_s)} s after SIGTERM')
    return
  if job_id is None:
    say(f'no job: nothing was launched from {place.launch_dir}')
    return
  state = job_state(job_id)
  if state.finished or state.name == 'UNKNOWN':
    say(f'job {job_id} is not running ({state.line})')
    return
  if state.waiting:
    _call(cancel_command(job_id))
    say(f'cancelled job {job_id} ({state.name}: it had not started)')
    return
  _call(signal_command(job_id))
  say(f'sent SIGTERM to the tasks of job {job_id}: the trainer saves a checkpoint and exits')
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    time.sleep(poll_s)
    state = job_state(job_id)
    if state.finished or state.name == 'UNKNOWN':
      say(f'stopped job {job_id} ({state.name})')
      return
    if state.waiting:  # requeued meanwhile (its time limit came too): it must not start again
      _call(cancel_command(job_id))
      say(f'stopped job {job_id} (requeued meanwhile, now cancelled)')
      return
  _call(cancel_command(job_id))
  say(f'cancelled job {job_id}: still running {int(timeout_s)} s after SIGTERM')


__all__ = ['Job', 'Place', 'State', 'batch_script', 'directives', 'current_venv', 'job_state',
           'parse_squeue', 'parse_sacct', 'run', 'submit_command', 'squeue_command',
           'sacct_command', 'signal_command', 'cancel_command', 'FINISHED', 'WAITING']
