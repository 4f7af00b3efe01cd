"""The gcloud argument lists and worker-side shell scripts of `launch` (pure functions).

Every worker keeps, besides the code in `repo_dir`, a launch directory (`launch_dir`, outside the
code, so a sync never touches it) with the detached run's `pid` and `log.txt` (an earlier log is
kept as `log.<seconds>.txt`). The run is started with `setsid nohup`, so its pid is also its process
group: --stop signals the whole group (SIGTERM: the trainer saves a checkpoint and exits; SIGKILL
after `stop_timeout` seconds if it has not).

Worker-side text is quoted with shlex; only a leading `~` stays unquoted, to expand on the worker.
"""

import shlex
from typing import List, Optional, Sequence

from vit_jax.errors import UserError
from vit_jax.launch.source import ARCHIVE

GCLOUD = ('gcloud', 'compute', 'tpus', 'tpu-vm')
LOCKS = ('requirements.lock', 'requirements-tpu.lock')  # the CPU-tested pins; jax[tpu]'s libtpu
PYTHON_MIN = (3, 11)  # Requires-Python of the pinned jax 0.10.2 / jaxlib / flax


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
               python: str = 'python3'):
    if not tpu or not zone:
      raise UserError('pass --tpu=NAME and --zone=ZONE of the Cloud TPU VM')
    if repo_dir.rstrip('/') in ('', '~', '.', '/'):
      raise UserError(f'--repo_dir={repo_dir} would replace a whole directory tree on each '
                      'worker: give a directory of its own, e.g. ~/vit_jax')
    self.tpu, self.where = tpu, [f'--zone={zone}'] + ([f'--project={project}'] if project else [])
    self.repo = repo_dir.rstrip('/')
    self.launch = launch_dir.rstrip('/')
    self.pid, self.log = f'{self.launch}/pid', f'{self.launch}/log.txt'
    self.python = python

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
    python = shlex.quote(self.python)
    pip = f'{python} -m pip install --quiet --no-deps'
    # The pins need Python >= 3.11 (jax 0.10.2's Requires-Python); say so before pip fails.
    check = (f'{python} -c "import sys; sys.exit(sys.version_info < {PYTHON_MIN})" || {{ echo '
             f'"error: $({python} --version 2>&1) on $(hostname): the pinned jax needs Python '
             f'>= {PYTHON_MIN[0]}.{PYTHON_MIN[1]}: install one and pass --python=python3.11" >&2;'
             f' exit 4; }}; ')
    return (f'set -e; {check}cd {remote_path(self.repo)}; {pip} -r {LOCKS[0]}; '
            f'{pip} --require-hashes -r {LOCKS[1]}')

  def start_script(self, command: Sequence[str]) -> str:
    launch, log, pid = (remote_path(p) for p in (self.launch, self.log, self.pid))
    return (f'{self._alive()}if alive; then echo "error: a launched run is still alive (pid $p):'
            f' stop it first (launch --stop)" >&2; exit 3; fi; mkdir -p {launch}; '
            f'if [ -f {log} ]; then mv {log} {launch}/log.$(date +%s).txt; fi; '
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


__all__ = ['GCLOUD', 'LOCKS', 'PYTHON_MIN', 'Plan', 'remote_path', 'worker_count']
