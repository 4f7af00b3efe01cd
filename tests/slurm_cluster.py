"""A one-node SLURM on this machine for tests/test_slurm.py: Debian's `slurmctld`, `slurmd` and
`munge` (installed with apt-get when missing), started as children of the test process from a
generated `slurm.conf` in a scratch folder.

The node has 2 CPUs, tracks processes through /proc (proctrack/linuxproc, task/none: no cgroups),
and listens on ports nothing else uses, so it cannot meet another cluster on the machine. Every
daemon runs in the foreground (`-D`, `-F`) as a child, and `stop()` ends each one by its PID after
cancelling the cluster's jobs. `unavailable()` says, in one line, why a cluster cannot be started
here (not root, no apt-get, the install failed), or None.
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Dict, List, Optional

PACKAGES = ('slurmctld', 'slurmd', 'slurm-client', 'munge')
COMMANDS = ('slurmctld', 'slurmd', 'munged', 'sbatch', 'srun', 'squeue', 'scancel', 'scontrol',
            'sinfo')
# The node's name: JAX's coordinator is the step's first node by name, so the name must resolve.
NODE = 'localhost'


def _tool(name: str) -> Optional[str]:
  """The path of one of SLURM's or munge's programs (the daemons are in /usr/sbin)."""
  found = shutil.which(name) or os.path.join('/usr/sbin', name)
  return found if os.access(found, os.X_OK) else None


def _missing() -> List[str]:
  return [c for c in COMMANDS if _tool(c) is None]


def unavailable() -> Optional[str]:
  """Why no SLURM can run here (one line), or None once the packages are installed."""
  if os.geteuid() != 0:
    return (f'its daemons run as root (SlurmUser=root), and this is uid {os.geteuid()}'
            + (f'; {", ".join(_missing())} are not installed either' if _missing() else ''))
  if not _missing():
    return None
  if shutil.which('apt-get') is None:
    return f'SLURM is not installed ({", ".join(_missing())} missing) and there is no apt-get'
  env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
  wait = '-oDPkg::Lock::Timeout=600'  # another apt-get may hold the lock (a parallel install)
  for command in (['apt-get', wait, 'update', '-qq'],
                  ['apt-get', wait, 'install', '-y', '-qq', *PACKAGES]):
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode:
      said = ' '.join((proc.stderr or proc.stdout).split())[-300:]
      return f'{" ".join(command)} failed with exit status {proc.returncode}: {said}'
  if _missing():
    return f'apt-get installed {" ".join(PACKAGES)} but {", ".join(_missing())} are missing'
  return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def slurm_conf(directory: str, host: str, ctld_port: int, slurmd_port: int) -> str:
  """The text of the cluster's slurm.conf (every path inside `directory`)."""
  d = directory
  return '\n'.join([
      'ClusterName=vitjaxtest',
      f'SlurmctldHost={host}(127.0.0.1)',
      f'SlurmctldPort={ctld_port}',
      f'SlurmdPort={slurmd_port}',
      'SlurmUser=root',
      'SlurmdUser=root',
      'AuthType=auth/munge',
      'CredType=cred/munge',
      f'AuthInfo=socket={d}/munge.socket,cred_expire=5',  # a requeued job waits this + 1 s
      'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none',
      'SelectType=select/cons_tres',
      'SelectTypeParameters=CR_Core',
      'MpiDefault=none',
      'JobAcctGatherType=jobacct_gather/none',
      f'StateSaveLocation={d}/state',
      f'SlurmdSpoolDir={d}/spool',
      f'SlurmctldPidFile={d}/slurmctld.pid',
      f'SlurmdPidFile={d}/slurmd.pid',
      f'SlurmctldLogFile={d}/slurmctld.log',
      f'SlurmdLogFile={d}/slurmd.log',
      'ReturnToService=2',
      'KillWait=10',  # seconds from SIGTERM to SIGKILL at a time limit or a cancel
      'MinJobAge=3600',  # finished jobs stay known to squeue (no accounting database here)
      'SchedulerParameters=sched_interval=1',
      f'NodeName={NODE} NodeAddr=127.0.0.1 CPUs=2 RealMemory=8000 State=UNKNOWN',
      f'PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES',
      ''])


class Cluster:
  """A running one-node SLURM: `env` is the environment its clients (sbatch, srun) need."""

  def __init__(self, directory: str):
    self.directory = directory
    self.host = socket.gethostname().split('.')[0]
    self.conf = os.path.join(directory, 'slurm.conf')
    self.env: Dict[str, str] = dict(os.environ, SLURM_CONF=self.conf)
    self._daemons: List[subprocess.Popen] = []

  def start(self, timeout_s: float = 60) -> 'Cluster':
    for sub in ('state', 'spool'):
      os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
    with open(self.conf, 'w') as f:
      f.write(slurm_conf(self.directory, self.host, _free_port(), _free_port()))
    d = self.directory
    os.chmod(d, 0o700)  # munged refuses a key or socket in a directory others may write to
    key = os.path.join(d, 'munge.key')  # this cluster's own key
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), 'wb') as f:
      f.write(os.urandom(1024))
    self._daemon([_tool('munged'), '--foreground', '--force', f'--socket={d}/munge.socket',
                  f'--pid-file={d}/munged.pid', f'--log-file={d}/munged.log',
                  f'--seed-file={d}/munged.seed', f'--key-file={key}'], 'munged.out')
    self._wait_for(lambda: os.path.exists(f'{d}/munge.socket'), 'munged', timeout_s)
    self._daemon([_tool('slurmctld'), '-D', '-f', self.conf], 'slurmctld.out')
    self._daemon([_tool('slurmd'), '-D', '-f', self.conf, '-N', NODE], 'slurmd.out')
    self._wait_for(self._node_idle, 'the node to be idle (sinfo)', timeout_s)
    return self

  def _daemon(self, command: List[str], out: str) -> None:
    with open(os.path.join(self.directory, out), 'wb') as f:
      self._daemons.append(subprocess.Popen(command, env=self.env, stdout=f, stderr=f,
                                            stdin=subprocess.DEVNULL))

  def _wait_for(self, predicate, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      for p in self._daemons:
        if p.poll() is not None:
          raise RuntimeError(f'{p.args[0]} exited with status {p.returncode} while waiting for '
                             f'{what}: {self.tail(os.path.basename(p.args[0]) + ".out")}')
      if predicate():
        return
      time.sleep(0.3)
    raise RuntimeError(f'timed out waiting for {what}: {self.tail("slurmctld.log")}')

  def tail(self, name: str, lines: int = 20) -> str:
    try:
      with open(os.path.join(self.directory, name), errors='replace') as f:
        return ''.join(f.readlines()[-lines:])
    except OSError:
      return f'(no {name})'

  def _node_idle(self) -> bool:
    proc = self.run(['sinfo', '-h', '-o', '%T'], check=False)
    return proc.returncode == 0 and proc.stdout.strip() == 'idle'

  def run(self, command: List[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault('timeout', 60)
    proc = subprocess.run(command, env=self.env, capture_output=True, text=True, **kwargs)
    if check and proc.returncode:
      raise RuntimeError(f'{" ".join(command)} failed ({proc.returncode}): {proc.stderr}')
    return proc

  def jobs(self) -> List[str]:
    proc = self.run(['squeue', '-h', '-o', '%i'], check=False)
    return proc.stdout.split() if proc.returncode == 0 else []

  def stop(self, timeout_s: float = 60) -> None:
    """Cancels the cluster's jobs (waiting for them to end), then ends each daemon by its PID."""
    try:
      if self._daemons and all(p.poll() is None for p in self._daemons):
        jobs = self.jobs()
        if jobs:
          self.run(['scancel', *jobs], check=False)
          deadline = time.monotonic() + timeout_s
          while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
      for p in reversed(self._daemons):
        if p.poll() is None:
          p.send_signal(signal.SIGTERM)
      for p in reversed(self._daemons):
        try:
          p.wait(timeout=20)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
      self._daemons = []
