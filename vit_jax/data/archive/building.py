"""Building an index: the units listed once, then indexed in parallel, then merged.

`build` lists the units once, then indexes them (indexing.py) in parallel (one process per usable
core, from `_POOL_FROM` units on) into one part file per unit, each written atomically, so a run
killed while indexing does only the missing parts when rerun; several hosts sharing the index
directory split the units by `shard=(index, count)`, each writing its own parts, and all merge
when every part exists. A progress line with an ETA goes to stderr. SIGTERM, SIGHUP or Ctrl-C
while indexing stop the workers and raise one `UserError` line (the parts written are kept;
nothing half-written is ever read as a part). Nothing decodes the images here (a corrupt image is
found, and skipped, when the input pipeline decodes it).

The index records what it was built from (`layouts.fingerprint`: the size and modification time
of each archive, or each class folder; with `deep=True`, of every file): an index whose source
has changed since is refused with a `UserError`, never reused (with `deep=True` a changed source
gets a new index instead, and the indexes of its earlier contents are removed). It also records a
*content* digest of every image (indexing.py), so that another archive with the same classes and
counts is other data, while a copy of the same files elsewhere is the same data.
"""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from vit_jax.data.archive.indexing import index_unit
from vit_jax.data.archive.layouts import NOTE_KINDS, Unit, fingerprint, list_units, under
from vit_jax.data.archive.store import (index_dir, read_json, remove_earlier, write_failure,
                                        write_json)
from vit_jax.errors import UserError
from vit_jax.platform import cpus

FORMAT = 3  # of the index files; an index of another format is built again
# Per image, how a zip stores it: its method (0 for a tar's or a folder's images) and the
# CRC-32 of its data. An index without them (all its images stored as they are) stays valid.
_ZIP_COLUMNS = ('method', 'data_crc')
_POOL_FROM = 16  # units from which indexing runs in a pool of processes (unless told)


def _hash_order(names: np.ndarray, name_ends: np.ndarray) -> np.ndarray:
  """The rows in ascending order of the SHA-256 of their names: a fixed shuffle, the same on
  every machine, that the slices of a split ('full[:51200]') take from."""
  blob = names.tobytes()
  starts = [0] + name_ends[:-1].tolist()
  digests = b''.join(hashlib.sha256(blob[a:b]).digest()
                     for a, b in zip(starts, name_ends.tolist()))
  return np.argsort(np.frombuffer(digests, 'S32'), kind='stable').astype(np.int64).reshape(-1)


class _Progress:
  """'indexing SOURCE: done/total units, elapsed, ETA' on stderr once indexing has taken
  `_QUIET_S` (a small source says nothing): redrawn in place on a terminal, otherwise a line at
  most every 10 s, and at the end. The ETA is left out until `_ETA_FROM` of the units this call
  indexes are done (the first units finish together, after the workers start: a rate from them
  means nothing)."""

  _QUIET_S = 5.0
  _ETA_FROM = 0.05

  def __init__(self, what: str, total: int, done: int):
    self._what, self._total, self._done = what, total, done
    self._start_done, self._t0 = done, time.monotonic()
    self._last = self._t0 + self._QUIET_S - 10  # the first line once _QUIET_S have passed
    self._said = False
    self._tty = sys.stderr.isatty()

  def step(self, n: int = 1) -> None:
    self._done += n
    now = time.monotonic()
    if now - self._t0 < self._QUIET_S and not self._said:
      return
    if self._done < self._total and now - self._last < (0.2 if self._tty else 10):
      return
    self._last, self._said = now, True
    line = (f'indexing {self._what}: {self._done}/{self._total} units, '
            f'{_clock(now - self._t0)} elapsed')
    indexed, to_index = self._done - self._start_done, self._total - self._start_done
    if self._done < self._total and indexed >= max(1.0, self._ETA_FROM * to_index):
      line += f', ETA {_clock((self._total - self._done) * (now - self._t0) / indexed)}'
    end = '\n' if self._done >= self._total or not self._tty else ''
    print(('\r' if self._tty else '') + line, end=end, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
  s = int(seconds + 0.5)
  return f'{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}'


class _Stopped(BaseException):
  """A stop signal while indexing (a BaseException, as KeyboardInterrupt, so that no `except
  Exception` on the way swallows it)."""


@contextlib.contextmanager
def _stop_signals():
  """SIGTERM, SIGHUP and SIGINT raise `_Stopped` here (main thread only)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def stop(signum, frame):
    del frame
    raise _Stopped(signal.Signals(signum).name)

  previous = {}
  try:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
      previous[sig] = signal.signal(sig, stop)
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _start_resource_tracker() -> None:
  """multiprocessing's resource tracker (the pool's locks register with it), started ignoring
  SIGHUP, which it keeps: it is in this process group, and a closed terminal must not kill it
  (it would be started again, then print tracebacks about the locks it lost)."""
  from multiprocessing import resource_tracker  # pylint: disable=g-import-not-at-top
  if threading.current_thread() is not threading.main_thread():
    resource_tracker.ensure_running()
    return
  previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
  try:
    resource_tracker.ensure_running()
  finally:
    signal.signal(signal.SIGHUP, previous)


def _worker_start() -> None:
  """An indexing process: Ctrl-C is its parent's to handle; it dies with its parent."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  with contextlib.suppress(Exception):  # Linux only; elsewhere it may outlive a killed parent
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def build(root: str, layout: str, base: str, *, shard: Tuple[int, int] = (0, 1),
          workers: Optional[int] = None, wait_s: float = 3600.0,
          on_part: Optional[Callable[[int], None]] = None,
          unit_name: Optional[Callable[[str], bool]] = None,
          deep: bool = False) -> Tuple[str, bool]:
  """Indexes the source at `root` under `base` if that is not done yet; (directory, whether this
  call wrote to it). `shard=(i, n)`: this host indexes units i, i + n, ... and waits up to
  `wait_s` for the others' parts; `workers`: processes (default: one per usable core, or this
  process alone for fewer than `_POOL_FROM` units);
  `on_part(k)` is called after part k is written; `unit_name`: which entry names are units (the
  others are strays); `deep`: see `fingerprint` (the directory is then named by it)."""
  now = fingerprint(root, layout, deep)
  directory = index_dir(root, layout, base, now if deep else '')
  meta = read_json(os.path.join(directory, 'meta.json'))
  if meta is not None and meta.get('format') == FORMAT:
    _check_unchanged(meta, now, root, directory)
    done = read_json(os.path.join(directory, 'done.json'))
    if isinstance(done, dict) and done.get('fingerprint') == meta['fingerprint']:
      _check_folders(done, root, directory)
      return directory, False
    units = [Unit(*u) for u in meta['units']]
  else:
    stale = meta is not None  # an index of another format: its parts would not fit
    units, notes = list_units(root, layout, unit_name)
    files = [] if layout in ('folders', 'flat_folder') else sorted({u.file for u in units})
    stats = [os.stat(under(root, f)) for f in files]
    meta = json.loads(json.dumps(dict(  # as read back: lists, not tuples
        format=FORMAT, root=os.path.abspath(root), layout=layout, fingerprint=now,
        units=[dataclasses.astuple(u) for u in units], files=files,
        file_stats=[[st.st_size, st.st_mtime_ns] for st in stats], notes=notes)))
    try:
      if stale:
        _clear(directory)
      os.makedirs(os.path.join(directory, 'parts'), exist_ok=True)
      write_json(os.path.join(directory, 'meta.json'), meta)
    except OSError as e:
      raise UserError(write_failure(e, directory)) from None
  part = lambda k: os.path.join(directory, 'parts', f'{k:07d}.npz')
  index, count = shard
  mine = [k for k in range(index, len(units), count) if not os.path.exists(part(k))]
  progress = _Progress(root, len(range(index, len(units), count)),
                       len(range(index, len(units), count)) - len(mine))
  file_ids = {name: i for i, name in enumerate(meta['files'])}
  tasks = [(root, layout, k, units[k], file_ids.get(units[k].file, -1), part(k))
           for k in mine]
  # Processes take seconds to start: a source of a few units is indexed in this one.
  n = min(workers or (cpus.usable() if len(tasks) >= _POOL_FROM else 1), len(tasks))
  try:
    with _stop_signals(), contextlib.ExitStack() as stack:
      if n <= 1:
        results = map(index_unit, tasks)
      else:
        _start_resource_tracker()
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(
            n, mp_context=multiprocessing.get_context('spawn'), initializer=_worker_start))
        stack.callback(_stop_workers, pool)
        results = (f.result() for f in concurrent.futures.as_completed(
            [pool.submit(index_unit, t) for t in tasks]))
      for k, error in results:
        if error:
          raise UserError(error)
        progress.step()
        if on_part:
          on_part(k)
  except _Stopped as e:
    _remove_temporary(directory)
    kept = sum(os.path.exists(part(k)) for k in range(len(units)))
    raise UserError(f'stopped by {e} while indexing {root}: {kept} of {len(units)} parts are '
                    f'indexed and kept in {directory}; rerun the same command to index the '
                    f'rest') from None
  except concurrent.futures.process.BrokenProcessPool:
    _remove_temporary(directory)
    raise UserError(f'an indexing process died (killed, or out of memory?) while indexing '
                    f'{root}: rerun the same command to index the rest') from None
  deadline = time.monotonic() + wait_s
  while not all(os.path.exists(part(k)) for k in range(len(units))):
    if time.monotonic() > deadline:
      raise UserError(f'the index in {directory} still misses parts of other hosts after '
                      f'{wait_s:.0f} s: run every host of the job (or one with shard 0/1)')
    time.sleep(2.0)
  try:
    _merge(directory, meta, [part(k) for k in range(len(units))])
  except OSError as e:
    raise UserError(write_failure(e, directory)) from None
  if deep:  # the indexes of the source's earlier contents: never read again
    remove_earlier(root, layout, base, directory)
  return directory, True


def _stop_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Ends the indexing processes at once (on a stop, an error or a dead process). SIGKILL: they
  hold nothing worth a clean exit (a part is written atomically), and a stopped or stuck one
  must not keep this process from exiting."""
  processes = list((getattr(pool, '_processes', None) or {}).values())
  for process in processes:
    with contextlib.suppress(Exception):
      process.kill()
  pool.shutdown(wait=True, cancel_futures=True)


def _remove_temporary(directory: str) -> None:
  """The half-written files of stopped writers (never read: a part is read only by its name)."""
  for folder in (directory, os.path.join(directory, 'parts')):
    with contextlib.suppress(OSError):
      for name in os.listdir(folder):
        if '.tmp' in name:
          with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, name))


def _clear(directory: str) -> None:
  """An index directory of another format: its files removed (its parts would not fit)."""
  if not os.path.isdir(directory):
    return
  for folder in (os.path.join(directory, 'parts'), directory):
    with contextlib.suppress(FileNotFoundError):
      for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
          os.remove(path)


def _check_unchanged(meta: dict, now, root: str, directory: str) -> None:
  if meta['fingerprint'] != now:
    then = {e[0]: e[1:] for e in meta['fingerprint']}
    changed = [e[0] for e in now if then.get(e[0]) != e[1:]] + sorted(
        set(then) - {e[0] for e in now})
    _refuse_changed(directory, root, changed)


def _check_folders(done: dict, root: str, directory: str) -> None:
  """UserError if a folder inside a class folder changed since indexing (an image added,
  removed or renamed in it), found by the modification times the index recorded."""
  changed = []
  for rel, mtime_ns in done.get('folders', ()):
    try:
      now = os.stat(under(root, rel)).st_mtime_ns
    except OSError:
      now = None
    if now != mtime_ns:
      changed.append(rel)
  if changed:
    _refuse_changed(directory, root, changed)


def _refuse_changed(directory: str, root: str, changed: Sequence[str]) -> None:
  raise UserError(f'the index in {directory} was built from other contents of {root} '
                  f'({len(changed)} changed: {", ".join(map(str, changed[:3])) or "the root"}):'
                  f' delete that directory to index the source again')


def _merge(directory: str, meta: dict, parts: Sequence[str]) -> None:
  """The parts -> one set of arrays (written atomically), then done.json (with the notes and
  the content digest); UserError for a file reached from two units."""
  columns = {key: [] for key in ('file_id', 'offset', 'size', 'mtime', 'names', 'name_lengths',
                                 'unit') + _ZIP_COLUMNS}
  folders = []
  notes = {kind: list(meta['notes'].get(kind, [])) for kind in NOTE_KINDS}
  content = hashlib.sha256()
  owner = {}  # (inode, size) of a linked file -> its name
  unit_files = {u[1] for u in meta['units']} - {''}
  for k, path in enumerate(parts):
    with np.load(path) as part:
      if json.loads(str(part['unit'])) != meta['units'][k]:
        raise UserError(f'part {path} of the index in {directory} indexes another unit: delete '
                        f'{directory} to index the source again')
      for key in ('file_id', 'offset', 'size', 'mtime', 'names', 'name_lengths'):
        columns[key].append(part[key])
      for key, dtype in zip(_ZIP_COLUMNS, (np.int8, np.uint32)):  # absent: no zip's part
        columns[key].append(part[key] if key in part.files else
                            np.zeros(len(part['file_id']), dtype))
      folders += json.loads(str(part['folders']))
      columns['unit'].append(np.full(len(part['file_id']), k, np.int32))
      for kind, names in json.loads(str(part['notes'])).items():
        notes[kind] += names
      for name, inode, size, home in json.loads(str(part['links'])):
        other = owner.setdefault((inode, size), name)
        if home is not None and home.split(os.sep)[0] in unit_files - {meta['units'][k][1]}:
          other = home  # a link to a file of another class folder
        if other.split('/')[0] != name.split('/')[0]:
          raise UserError(f'{os.path.join(meta["root"], other)} and '
                          f'{os.path.join(meta["root"], name)} are the same file (a link) in two '
                          f'classes: an image has one class; remove one of them')
      content.update(f'{meta["units"][k][0]}\0{part["digest"]}\n'.encode(
          'utf-8', 'surrogateescape'))
  arrays = {key: np.concatenate(value) if value else np.zeros([0], np.int64)
            for key, value in columns.items()}
  arrays['name_ends'] = np.cumsum(arrays.pop('name_lengths')).astype(np.int64)
  arrays['hash_order'] = _hash_order(arrays['names'], arrays['name_ends'])
  if not arrays['method'].any():  # no zip: the index as it was before zips were read
    for key in _ZIP_COLUMNS:
      del arrays[key]
  tmp = os.path.join(directory, f'index.{os.getpid()}.tmp.npz')
  np.savez(tmp, **arrays)
  os.replace(tmp, os.path.join(directory, 'index.npz'))
  write_json(os.path.join(directory, 'done.json'), dict(
      fingerprint=meta['fingerprint'], content=content.hexdigest()[:16], notes=notes,
      folders=folders))



__all__ = ['FORMAT', 'build']
