"""One writer per workdir: a training run holds `<workdir>/run.lock` while it runs.

The lock file is a JSON record of its holder: host, PID (and the PID's start time, so a reused
PID is not mistaken for the holder), boot id, start time and a heartbeat time that the holder
rewrites every `HEARTBEAT_S` seconds. A run that finds a lock held exits at once with one line
naming the holder (`WorkdirInUse`). A lock is stale, and taken over with a note on stderr, when

  same host      the holder's process is not running (killed, crashed), its PID now belongs to
                 another process (other start time), or the host restarted since (other boot id);
  another host   the heartbeat is older than `STALE_AFTER_S` (10 minutes: the holder writes one
                 every minute, so its host is lost, or its file system has hung for 10 minutes);
  a SLURM job    the holder ran in this SLURM job before it was requeued (the record's job id is
                 this one's, its restart count lower): SLURM starts a requeued job only once the
                 earlier run has ended, on whichever node it ran.

Creating the lock is atomic where the storage allows it: on a local (or NFS) disk the record is
written to a temporary file and hard-linked to the lock's name, which fails if the name exists.
On other file systems (gs://, through `tf.io.gfile`, which has no create-if-absent) the record is
written when no lock exists and read back after `SETTLE_S` seconds: reads after a write are
strongly consistent on GCS, so of two runs that start together the later writer wins and the
other one sees its record and stops. (Only a run that stalls for more than `SETTLE_S` between
its check and its write can slip past this.)

A multi-process run holds one lock, taken by process 0; every process learns the outcome. Only
training takes the lock; commands that only read a workdir (predict, analyze, fewshot, export,
convert) do not, and `holder()` lets a caller (the sweep) see who holds one without taking it.
"""

import dataclasses
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Optional, Tuple

from vit_jax.errors import UserError
from vit_jax.fileio import gfile, is_remote

LOCK_FILE = 'run.lock'
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
SETTLE_S = 2.0


class WorkdirInUse(UserError):
  """The workdir is held by another run (one line naming the holder and the way out)."""


@dataclasses.dataclass(frozen=True)
class Holder:
  """The record in a lock file."""
  host: str
  pid: int
  started: float
  heartbeat: float
  token: str
  pid_start: Optional[int] = None  # /proc/<pid>/stat start time (clock ticks after boot)
  boot_id: Optional[str] = None
  slurm_job: Optional[str] = None  # SLURM_JOB_ID, in a SLURM job
  slurm_restart: Optional[int] = None  # SLURM_RESTART_COUNT (times the job was requeued)

  @classmethod
  def of_this_process(cls) -> 'Holder':
    now = time.time()
    job, restart = _slurm_run()
    return cls(host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now,
               token=uuid.uuid4().hex, pid_start=_process_start(os.getpid()), boot_id=_boot_id(),
               slurm_job=job, slurm_restart=restart)

  def to_bytes(self) -> bytes:
    return json.dumps(dataclasses.asdict(self)).encode()

  @classmethod
  def from_bytes(cls, data: bytes) -> Optional['Holder']:
    try:
      record = json.loads(data.decode())
      return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})
    except (ValueError, TypeError, KeyError, AttributeError):
      return None

  def describe(self) -> str:
    started = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))
    return f'pid {self.pid} on host {self.host}, started {started}'

  def stale_reason(self, now: Optional[float] = None) -> Optional[str]:
    """Why this holder is gone (see the module docstring), or None if it may still be running."""
    now = time.time() if now is None else now
    job, restart = _slurm_run()
    if job is not None and self.slurm_job == job and (self.slurm_restart or 0) < restart:
      return f'its SLURM job {job} was requeued since'
    if self.host == socket.gethostname():
      this_boot = _boot_id()
      if self.boot_id and this_boot and self.boot_id != this_boot:
        return 'its host restarted since'
      if not _running(self.pid, self.pid_start):
        return f'process {self.pid} is not running'
      return None
    if now - self.heartbeat > STALE_AFTER_S:
      return f'no heartbeat for {(now - self.heartbeat) / 60:.0f} minutes'
    return None


def _slurm_run() -> Tuple[Optional[str], Optional[int]]:
  """(SLURM job id, times it was requeued) of this process, or (None, None) outside SLURM."""
  job = os.environ.get('SLURM_JOB_ID') or None
  if job is None:
    return None, None
  try:
    return job, int(os.environ.get('SLURM_RESTART_COUNT') or 0)
  except ValueError:
    return job, 0


def _process_start(pid: int) -> Optional[int]:
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      fields = f.read().rsplit(b')', 1)[1].split()
  except (OSError, IndexError):
    return None
  return int(fields[19]) if len(fields) > 19 else None


def _boot_id() -> Optional[str]:
  try:
    with open('/proc/sys/kernel/random/boot_id') as f:
      return f.read().strip()
  except OSError:
    return None


def _running(pid: int, pid_start: Optional[int]) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: it exists
    pass
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      if f.read().rsplit(b')', 1)[1].split()[0] == b'Z':  # a zombie: dead, not yet reaped
        return False
  except (OSError, IndexError):
    pass
  return pid_start is None or _process_start(pid) in (None, pid_start)


# ---------------------------------------------------------------------------------------------
# Where the record lives: a local file, or an object through tf.io.gfile (gs://, ...).


class LocalStore:
  """A lock file on a local or NFS disk: atomic create by hard link, atomic replace."""

  def create(self, path: str, data: bytes) -> bool:
    tmp = f'{path}.{uuid.uuid4().hex}.tmp'
    with open(tmp, 'wb') as f:
      f.write(data)
    try:
      os.link(tmp, path)
      return True
    except FileExistsError:
      return False
    finally:
      os.unlink(tmp)

  def read(self, path: str) -> Optional[bytes]:
    try:
      with open(path, 'rb') as f:
        return f.read()
    except FileNotFoundError:
      return None

  def replace(self, path: str, data: bytes) -> None:
    tmp = f'{path}.{uuid.uuid4().hex}.tmp'
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)

  def remove_if(self, path: str, expected: bytes) -> bool:
    """Removes the lock if it still holds `expected` (moved aside first, so that a record
    written in between by another run is put back, not deleted)."""
    aside = f'{path}.{uuid.uuid4().hex}.old'
    try:
      os.rename(path, aside)
    except FileNotFoundError:
      return True
    with open(aside, 'rb') as f:
      found = f.read()
    if found != expected:
      try:
        os.link(aside, path)
      except FileExistsError:
        pass
      os.unlink(aside)
      return False
    os.unlink(aside)
    return True

  def settle(self) -> None:
    pass  # the hard link is atomic: nothing to wait for


class GfileStore:
  """A lock object through tf.io.gfile (gs://, ram://, ...): no create-if-absent there, so a
  record is written when none exists and read back after SETTLE_S seconds (module docstring)."""

  def create(self, path: str, data: bytes) -> bool:
    if self.read(path) is not None:
      return False
    self.replace(path, data)
    return True

  def read(self, path: str) -> Optional[bytes]:
    files = gfile()
    if not files.exists(path):
      return None
    with files.GFile(path, 'rb') as f:
      return f.read()

  def replace(self, path: str, data: bytes) -> None:
    with gfile().GFile(path, 'wb') as f:
      f.write(data)

  def remove_if(self, path: str, expected: bytes) -> bool:
    if self.read(path) != expected:
      return False
    gfile().remove(path)
    return True

  def settle(self) -> None:
    time.sleep(SETTLE_S)


def store_for(workdir: str):
  return GfileStore() if is_remote(workdir) else LocalStore()


def lock_path(workdir: str) -> str:
  return os.path.join(workdir, LOCK_FILE)


def holder(workdir: str, store=None) -> Optional[Holder]:
  """The live holder of the workdir's lock, or None (no lock, a stale or an unreadable one)."""
  store = store or store_for(workdir)
  data = store.read(lock_path(workdir))
  if data is None:
    return None
  found = Holder.from_bytes(data)
  return None if found is None or found.stale_reason() else found


def _in_use(workdir: str, other: Holder) -> WorkdirInUse:
  return WorkdirInUse(f'--workdir={workdir} is in use by another run ({other.describe()}): wait '
                      f'for it to finish or stop it; if it is gone, delete {lock_path(workdir)}')


def check_free(workdir: str) -> None:
  """Raises WorkdirInUse when a live run holds the workdir: a second run stops before it builds
  anything (taking the lock, later, is what excludes two runs)."""
  try:
    other = holder(workdir)
  except OSError:  # an unreadable lock: taking it says what is wrong
    return
  if other is not None:
    raise _in_use(workdir, other)


# ---------------------------------------------------------------------------------------------
# Taking and keeping the lock.


class WorkdirLock:
  """Holds `<workdir>/run.lock` from `acquire()` to `release()`, with a heartbeat thread."""

  def __init__(self, workdir: str, *, store=None, say=None):
    self.workdir, self.path = workdir, lock_path(workdir)
    self._store = store or store_for(workdir)
    self._say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    self._me = Holder.of_this_process()
    self._data = self._me.to_bytes()
    self._stop = threading.Event()
    self._thread = None

  def acquire(self) -> 'WorkdirLock':
    for _ in range(3):  # a stale lock is removed, then the create is tried again
      if self._try_create():
        self._thread = threading.Thread(target=self._beat, name='workdir_lock', daemon=True)
        self._thread.start()
        return self
    raise WorkdirInUse(f'--workdir={self.workdir} keeps changing hands ({self.path}); '
                       'another run is starting there: use another --workdir')

  def _try_create(self) -> bool:
    try:
      if self._store.create(self.path, self._data):
        self._store.settle()
        if self._store.read(self.path) == self._data:
          return True
    except OSError as e:
      raise UserError(f'cannot write to --workdir={self.workdir} ({e.strerror or e}): pass a '
                      'writable directory') from None
    data = self._store.read(self.path)
    if data is None:
      return False  # released in between: try again
    other = Holder.from_bytes(data)
    if other is None:
      raise WorkdirInUse(f'--workdir={self.workdir} is locked by {self.path}, which is being '
                         'written or damaged: if no other run uses this workdir, delete it')
    reason = other.stale_reason()
    if reason is None:
      raise _in_use(self.workdir, other)
    if self._store.remove_if(self.path, data):
      self._say(f'note: took over the lock of a run that is gone ({other.describe()}: {reason})')
    return False

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        if self._store.read(self.path) != self._data:
          self._say(f'warning: the lock {self.path} was taken over by another run; this run '
                    'goes on, but two runs may now write to this workdir')
          return
        self._data = dataclasses.replace(self._me, heartbeat=time.time()).to_bytes()
        self._store.replace(self.path, self._data)
      except OSError:  # a failed heartbeat is not fatal; the next one tries again
        pass

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    try:
      self._store.remove_if(self.path, self._data)
    except OSError:
      pass  # a read-only or full disk: the lock is stale once this process has exited


def hold(workdir: str):
  """The lock of a training run: taken by process 0, the outcome shared with every process.
  Returns an object with `release()` (a no-op on other processes)."""
  import jax  # pylint: disable=g-import-not-at-top
  error, lock = None, None
  if jax.process_index() == 0:
    try:
      lock = WorkdirLock(workdir).acquire()
    except UserError as e:
      error = e
  if jax.process_count() > 1:
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    failed = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if failed and error is None:
      raise WorkdirInUse(f'process 0 could not lock --workdir={workdir} (its error says why)')
  if error is not None:
    raise error
  return lock or _NoLock()


class _NoLock:

  def release(self) -> None:
    pass


__all__ = ['WorkdirLock', 'WorkdirInUse', 'Holder', 'check_free', 'hold', 'holder', 'lock_path',
           'LocalStore', 'GfileStore', 'store_for', 'LOCK_FILE', 'HEARTBEAT_S', 'STALE_AFTER_S', 'SETTLE_S']
