"""Cloud TPU VMs: ship the code, install the pinned packages, run one command on every worker.

  python -m vit_jax launch --tpu=NAME --zone=ZONE --sync --setup -- python3 -m vit_jax.main ...
  python -m vit_jax launch --tpu=NAME --zone=ZONE --status     # alive on each worker? last lines
  python -m vit_jax launch --tpu=NAME --zone=ZONE --logs       # the last --lines of each log
  python -m vit_jax launch --tpu=NAME --zone=ZONE --stop       # ends the run on every worker

Steps run in the order stop, sync, setup, start, status, logs, each through `gcloud compute tpus
tpu-vm` (scp / ssh --worker=all; status and logs go worker by worker, from `describe`). sync ships
the checkout's tracked files only (source.py) and replaces the code directory on each worker;
setup installs requirements.lock and the libtpu of requirements-tpu.lock (jax[tpu] of the pinned
jax) with uv into a Python 3.11 venv in the launch directory; start detaches the command on every
worker at once, that venv first on its PATH (remote.py). Multi-host JAX needs the same command on
every worker: `vit_jax.main` finds the slice's coordinator by itself, and a worker whose peers
never arrive stops after --distributed_timeout with one `error:` line in its log.
"""

import dataclasses
import shlex
import tempfile
from typing import Callable, List, Optional, Sequence

from vit_jax.errors import UserError
from vit_jax.tools.launch import source, tools
from vit_jax.tools.launch.remote import Plan, uv_pin, worker_count


@dataclasses.dataclass
class Steps:
  sync: bool = False
  setup: bool = False
  command: Sequence[str] = ()
  status: bool = False
  logs: bool = False
  stop: bool = False
  lines: int = 20
  stop_timeout: int = 60


def _call(command: List[str], *, capture: bool = False) -> str:
  return tools.call(command, capture=capture, markers=GCLOUD_MARKERS,
                    missing='install the Google Cloud CLI, or use --dry_run and run the printed '
                    'commands elsewhere')


GCLOUD_MARKERS = ('ERROR:',)  # how gcloud's lines that say why it failed begin


def check_steps(steps: Steps, choices: str, stopped: str) -> None:
  """UserError for steps that do nothing, or that stop `stopped` and look at it in one go."""
  if not (steps.sync or steps.setup or steps.command or steps.status or steps.logs or steps.stop):
    raise UserError('no command to run and nothing else to do: put the command after --, or '
                    f'pass {choices}')
  if steps.stop and (steps.status or steps.logs) and not steps.command:
    asked = ' and '.join(f'--{n}' for n in ('status', 'logs') if getattr(steps, n))
    raise UserError(f'--stop with {asked}: --stop ends {stopped}; pass {asked} alone to look at '
                    'it, or --stop alone to end it')


def run(plan: Plan, steps: Steps, *, local_dir: str = '.', dry_run: bool = False,
        say: Callable[[str], None] = print) -> None:
  """Runs (or, with dry_run, prints) the gcloud commands of `steps` in order."""
  check_steps(steps, '--sync, --setup, --status, --logs or --stop', 'the run on every worker')
  if steps.stop:
    _do(plan.stop(steps.stop_timeout), dry_run, say)
  if steps.sync and dry_run:  # the printed commands name an archive that stays for them
    archive = source.write_archive(local_dir, tempfile.mkdtemp(prefix='vit_jax_launch_'))
    say(f'# the source archive is kept at {archive} for these commands; delete it afterwards')
    for command in plan.sync(archive):
      _do(command, dry_run, say)
  elif steps.sync:
    with tempfile.TemporaryDirectory() as tmp:
      archive = source.write_archive(local_dir, tmp)
      for command in plan.sync(archive):
        _do(command, dry_run, say)
  if steps.setup:
    _do(plan.setup(), dry_run, say)
  if steps.command:
    _do(plan.start(steps.command), dry_run, say)
  if steps.status or steps.logs:
    _per_worker(plan, steps, dry_run, say)


def _do(command: List[str], dry_run: bool, say) -> None:
  say(shlex.join(command))
  if not dry_run:
    _call(command)


def _per_worker(plan: Plan, steps: Steps, dry_run: bool, say) -> None:
  if dry_run:
    say(shlex.join(plan.describe()))
    for make in ([plan.status] if steps.status else []) + ([plan.logs] if steps.logs else []):
      say(shlex.join(make('I', steps.lines)) + '   # for each worker I')
    return
  workers = worker_count(_call(plan.describe(), capture=True), plan.tpu)
  for i in range(workers):
    if steps.status:
      first, *rest = _answer(plan.status(i, steps.lines)).splitlines() or ['(no answer)']
      say(f'worker {i}: {first}')
      for line in rest:
        say(f'  {line}')
    if steps.logs:
      say(f'== worker {i}: {plan.log}')
      for line in _answer(plan.logs(i, steps.lines)).splitlines():
        say(line)


def _answer(command: List[str]) -> str:
  """A worker's answer, or why there is none (one unreachable worker does not hide the rest)."""
  try:
    return _call(command, capture=True)
  except UserError as e:
    return f'no answer: {e}'


__all__ = ['Plan', 'Steps', 'check_steps', 'run', 'source', 'uv_pin']
