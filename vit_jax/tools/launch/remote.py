"""The gcloud argument lists and worker-side shell scripts of `launch` (pure functions).

Every worker keeps, besides the code in `repo_dir`, a launch directory (`launch_dir`, outside the
code, so a sync never touches it) with the detached run's `pid` and `log.txt` (an earlier log is
kept as `log.<seconds>.txt`). The run is started with `setsid nohup`, so its pid is also its process
group: --stop signals the whole group (SIGTERM: the trainer saves a checkpoint and exits; SIGKILL
after `stop_timeout` seconds if it has not).

Worker-side text is quoted with shlex; only a leading `~` stays unquoted, to expand on the worker.
"""

import os
import shlex
from typing import List, Optional, Sequence

from vit_jax.errors import UserError
from vit_jax.tools.launch.source import ARCHIVE

GCLOUD = ('gcloud', 'compute', 'tpus', 'tpu-vm')
LOCKS = ('requirements.lock', 'requirements-tpu.lock')  # the CPU-tested pins; jax[tpu]'s libtpu
# The Python of the workers' venv: the one the locks were tested on (the pinned jax 0.10.2, jaxlib
# and flax need >= 3.11; the TPU VM images of Ubuntu 22.04 ship 3.10, so uv fetches one there).
PYTHON_VERSION = '3.11'


def uv_pin(lock_path: Optional[str] = None) -> str:
  """The `uv==X` line of requirements.lock (by default this checkout's): the uv that installs the
  locks on the workers."""
  if lock_path is None:
    top = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    lock_path = os.path.join(top, LOCKS[0])
  try:
    with open(lock_path) as f:
      pins = [line.split()[0] for line in f if line.startswith('uv==')]
  except OSError as e:
    raise UserError(f'cannot read {lock_path} ({e.strerror}): --setup installs the pinned locks '
                    'of a checkout; run launch from one') from None
  if not pins:
    raise UserError(f'{lock_path} pins no uv (a line uv==VERSION): restore it from git')
  return pins[0]


def remote_path(path: str) -> str:
  """`path` for a worker's shell: quoted, except a leading `~` (which must expand there)."""
  if path == '~' or path.startswith('~/'):
    rest = path[2:]
    return '~' + (f'/{shlex.quote(rest)}' if rest else '')
  return shlex.quote(path)


class Plan:
  """The commands for one TPU VM (`tpu` in `zone`) with the code in `repo_dir` on each worker."""

  def __init__(self, tpu: str, zone: str, project: Optional[str] = None,
               repo_dir: str = '~/vit_jax', launch_dir: str = '~/vit_jax_launch',
               python: str = 'python3', uv: str = 'uv'):
    if not tpu or not zone:
      raise UserError('pass --tpu=NAME and --zone=ZONE of the Cloud TPU VM (or --slurm to run as '
                      'a SLURM job)')
    if repo_dir.rstrip('/') in ('', '~', '.', '/'):
      raise UserError(f'--repo_dir={repo_dir} would replace a whole directory tree on each '
                      'worker: give a directory of its own, e.g. ~/vit_jax')
    self.tpu, self.where = tpu, [f'--zone={zone}'] + ([f'--project={project}'] if project else [])
    self.repo = repo_dir.rstrip('/')
    self.launch = launch_dir.rstrip('/')
    self.pid, self.log = f'{self.launch}/pid', f'{self.launch}/log.txt'
    self.python, self.uv = python, uv  # the Python that bootstraps uv; uv's pin (uv_pin)
    self.venv = f'{self.launch}/venv'

  # -- gcloud argument lists ---------------------------------------------------------------------

  def ssh(self, script: str, worker='all') -> List[str]:
    return [*GCLOUD, 'ssh', self.tpu, *self.where, f'--worker={worker}', f'--command={script}']

  def describe(self) -> List[str]:
    return [*GCLOUD, 'describe', self.tpu, *self.where, '--format=json']

  def sync(self, archive: str) -> List[List[str]]:
    """Copy the source tarball to every worker, then replace `repo_dir` with its contents."""
    return [[*GCLOUD, 'scp', archive, f'{self.tpu}:{ARCHIVE}', *self.where, '--worker=all'],
            self.ssh(self.unpack_script())]

  def setup(self) -> List[str]:
    return self.ssh(self.setup_script())

  def start(self, command: Sequence[str]) -> List[str]:
    if not command:
      raise UserError('no command to run: put it after --, e.g. -- python3 -m vit_jax.main '
                      '--config=... --workdir=gs://bucket/run')
    return self.ssh(self.start_script(command))

  def status(self, worker: int, lines: int) -> List[str]:
    return self.ssh(self.status_script(lines), worker)

  def logs(self, worker: int, lines: int) -> List[str]:
    return self.ssh(f'tail -n {int(lines)} {remote_path(self.log)} 2>/dev/null || '
                    'echo "(no log: nothing was launched here)"', worker)

  def stop(self, timeout_s: int) -> List[str]:
    return self.ssh(self.stop_script(timeout_s))

  # -- worker-side scripts ------------------------------------------------------------------------

  def _alive(self) -> str:
    # A pid file whose process exists and is not a zombie (ps prints nothing for a dead one).
    return (f'alive() {{ p=$(cat {remote_path(self.pid)} 2>/dev/null) && [ -n "$p" ] && '
            f'ps -o stat= -p "$p" 2>/dev/null | grep -qv "^Z"; }}; ')

  def unpack_script(self) -> str:
    repo, new, old = (remote_path(self.repo + s) for s in ('', '.new', '.old'))
    # The old tree is moved away whole (never extracted into: no nesting, no stale files); its
    # runs/ (the default place of workdirs) moves into the new tree.
    return (f'set -e; {self._alive()}if alive; then echo "error: a launched run is alive (pid $p)'
            f': stop it first (launch --stop)" >&2; exit 3; fi; '
            f'rm -rf {new}; mkdir -p {new}; tar -xzf ~/{ARCHIVE} -C {new}; '
            f'if [ -d {repo}/runs ] && [ ! -e {new}/runs ]; then mv {repo}/runs {new}/runs; fi; '
            f'rm -rf {old}; if [ -e {repo} ]; then mv {repo} {old}; fi; mv {new} {repo}; '
            f'rm -rf {old} ~/{ARCHIVE}')

  def setup_script(self) -> str:
    # uv (pinned) goes into <launch_dir>/uv with the worker's own pip (--target: no venv module and
    # no PEP 668 refusal needed); it makes <launch_dir>/venv with Python PYTHON_VERSION (the
    # worker's if it has one, else a uv-managed one it downloads) and installs both locks there.
    # A second setup reuses uv and the venv. start_script puts the venv first on PATH.
    python, pin = shlex.quote(self.python), shlex.quote(self.uv)
    uv_dir = remote_path(f'{self.launch}/uv')
    uv = remote_path(f'{self.launch}/uv/bin/uv')
    version = shlex.quote(self.uv.split('==', 1)[-1])
    install = (f'{uv} pip install --quiet --python {remote_path(self.venv + "/bin/python")} '
               '--no-deps')
    return (f'set -e; cd {remote_path(self.repo)}; '
            f'if [ "$({uv} --version 2>/dev/null | cut -d" " -f2)" != {version} ]; then '
            f'{python} -m pip install --quiet --no-deps --upgrade --target {uv_dir} {pin} || {{ '
            f'echo "error: pip could not install {self.uv} on $(hostname): install pip there '
            f'(sudo apt-get install -y python3-pip) or pass --python=A_PYTHON_WITH_PIP" >&2; '
            f'exit 4; }}; fi; '
            f'{uv} venv --quiet --allow-existing --python {PYTHON_VERSION} '
            f'{remote_path(self.venv)}; '
            f'{install} -r {LOCKS[0]}; {install} --require-hashes -r {LOCKS[1]}')

  def start_script(self, command: Sequence[str]) -> str:
    launch, log, pid = (remote_path(p) for p in (self.launch, self.log, self.pid))
    return (f'{self._alive()}if alive; then echo "error: a launched run is still alive (pid $p):'
            f' stop it first (launch --stop)" >&2; exit 3; fi; mkdir -p {launch}; '
            f'if [ -f {log} ]; then mv {log} {launch}/log.$(date +%s).txt; fi; '
            f'export PATH={remote_path(self.venv + "/bin")}:"$PATH"; '
            f'cd {remote_path(self.repo)} && '
            f'{{ setsid nohup {shlex.join(command)} > {log} 2>&1 < /dev/null & echo $! > {pid}; }}')

  def status_script(self, lines: int) -> str:
    log = remote_path(self.log)
    return (f'{self._alive()}if alive; then echo "running (pid $p)"; '
            f'elif [ -n "$p" ]; then echo "not running (pid $p has ended)"; '
            f'else echo "not running (nothing launched)"; fi; '
            f'if [ -f {log} ]; then tail -n {int(lines)} {log}; fi')

  def stop_script(self, timeout_s: int) -> str:
    t = int(timeout_s)
    return (f'{self._alive()}if alive; then kill -TERM -- -"$p" 2>/dev/null || kill -TERM "$p"; '
            f'i=0; while alive && [ $i -lt {t} ]; do sleep 1; i=$((i+1)); done; '
            f'if alive; then kill -KILL -- -"$p" 2>/dev/null || kill -KILL "$p"; '
            f'echo "killed (pid $p): still running {t} s after SIGTERM"; '
            f'else echo "stopped (pid $p)"; fi; else echo "not running"; fi')


def worker_count(describe_json: str, tpu: str) -> int:
  """The number of workers in `gcloud ... describe --format=json` output."""
  import json  # pylint: disable=g-import-not-at-top
  try:
    endpoints = json.loads(describe_json).get('networkEndpoints') or []
  except (ValueError, AttributeError):
    endpoints = []
  if not endpoints:
    raise UserError(f'gcloud describe {tpu} lists no workers (networkEndpoints): check --tpu and '
                    '--zone, and that the TPU VM is READY')
  return len(endpoints)


__all__ = ['GCLOUD', 'LOCKS', 'PYTHON_VERSION', 'Plan', 'remote_path', 'uv_pin',
           'worker_count']
