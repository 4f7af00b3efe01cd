"""Where every image of an image archive or folder is, so it streams without a copy.

A *source* is one of five layouts (`LAYOUTS`), at a path:
  tar_of_tars   one tar whose members are per-class tars ('n01440764.tar') of images, as the
                ImageNet releases ship (fall11_whole.tar, ILSVRC2012_img_train.tar);
  tars          a folder of per-class tars;
  folders       a folder of per-class folders of images;
  flat_tar      one tar of images (ILSVRC2012_img_val.tar);
  flat_folder   a folder of images.
Its *units* are the per-class tars or folders (one unit for the flat layouts); the index holds,
for each image, the unit it is in, its name ('<unit>/<member>'), and where its bytes are: a file
of the source and the byte range in it (a member of a tar inside the outer tar is addressed by the
outer offset plus the inner one), or, for the folder layouts, its own file.

Building (`build`) lists the units once, then indexes them in parallel (one process per usable
core) into one part file per unit, each written atomically, so a run killed while indexing does
only the missing parts when rerun; several hosts sharing the index directory split the units by
`shard=(index, count)`, each writing its own parts, and all merge when every part exists. A
progress line with an ETA goes to stderr. Files without an image extension are counted and left
out; nothing reads the images' bytes here (a corrupt image is found, and skipped, when the input
pipeline decodes it).

The index records what it was built from (`fingerprint`: the size and modification time of each
archive, or each class folder): an index whose source has changed since is refused with a
`UserError`, never reused.
"""

import contextlib
import dataclasses
import hashlib
import io
import json
import multiprocessing
import os
import re
import sys
import tarfile
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax.platform import cpus
from vit_jax.errors import UserError

LAYOUTS = ('tar_of_tars', 'tars', 'folders', 'flat_tar', 'flat_folder')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
FORMAT = 1  # of the index files; an index of another format is built again
_BLOCK = 512  # tar block size


@dataclasses.dataclass(frozen=True)
class Unit:
  """A per-class tar (`offset`, `size`: its bytes in `file`) or folder (`file` is its path)."""
  name: str
  file: str  # relative to the source's root ('' for the root itself)
  offset: int
  size: int


@dataclasses.dataclass
class Index:
  """The images of a source: per image (row) its unit, name, file and byte range."""
  root: str
  layout: str
  units: Tuple[str, ...]     # unit names, in source order
  files: Tuple[str, ...]     # the files the rows read (relative to root); file -1: the own file
  unit: np.ndarray           # int32 [N]
  file: np.ndarray           # int32 [N]
  offset: np.ndarray         # int64 [N]
  size: np.ndarray           # int64 [N]
  names: np.ndarray          # uint8: the names, '/'-joined, back to back
  name_ends: np.ndarray      # int64 [N]
  skipped_non_images: int
  hash_order: np.ndarray    # int64 [N]: the rows by the SHA-256 of their names (`_hash_order`)
  _fds: dict = dataclasses.field(default_factory=dict, repr=False)  # file -> open descriptor

  def __len__(self) -> int:
    return len(self.unit)

  def read(self, row: int) -> bytes:
    """The bytes of image `row`, read in place (b'' if they cannot be read: the pipeline then
    skips it as corrupt)."""
    f = int(self.file[row])
    try:
      if f < 0:
        with open(self.path(row), 'rb') as own:
          return own.read()
      fd = self._fds.get(f)
      if fd is None:
        fd = self._fds.setdefault(f, os.open(_under(self.root, self.files[f]), os.O_RDONLY))
      return os.pread(fd, int(self.size[row]), int(self.offset[row]))
    except OSError:
      return b''

  def _name_bytes(self, row: int) -> bytes:
    start = int(self.name_ends[row - 1]) if row else 0
    return bytes(self.names[start:int(self.name_ends[row])])

  def name(self, row: int) -> str:
    """The image's name as text (bytes that are not UTF-8 shown as backslash escapes)."""
    return self._name_bytes(row).decode('utf-8', 'backslashreplace')

  def path(self, row: int) -> str:
    """The file holding image `row`."""
    f = int(self.file[row])
    return _under(self.root, self.files[f] if f >= 0 else os.fsdecode(self._name_bytes(row)))



def _under(root: str, rel: str) -> str:
  """`rel` under `root` ('' is `root` itself, a single-file source)."""
  return os.path.join(root, rel) if rel else root


def _hash_order(names: np.ndarray, name_ends: np.ndarray) -> np.ndarray:
  """The rows in ascending order of the SHA-256 of their names: a fixed shuffle, the same on
  every machine, that the slices of a split ('full[:51200]') take from."""
  blob = names.tobytes()
  starts = [0] + name_ends[:-1].tolist()
  digests = b''.join(hashlib.sha256(blob[a:b]).digest()
                     for a, b in zip(starts, name_ends.tolist()))
  return np.argsort(np.frombuffer(digests, 'S32'), kind='stable').astype(np.int64).reshape(-1)


# ---------------------------------------------------------------------------------------------
# Units and fingerprints.


def _is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_EXTENSIONS)


def _stem(name: str) -> str:
  base = name.rstrip('/').rsplit('/', 1)[-1]
  return base[:-4] if base.lower().endswith('.tar') else base


def _visible(root: str) -> List[os.DirEntry]:
  return sorted((e for e in os.scandir(root) if not e.name.startswith('.')), key=lambda e: e.name)


def list_units(root: str, layout: str) -> Tuple[List[Unit], int]:
  """(units in source order, non-image entries beside them) of the source at `root`."""
  if layout == 'tar_of_tars':
    units, others = [], 0
    for member in _members(root, os.path.getsize(root), 0, root):
      if member.name.lower().endswith('.tar'):
        units.append(Unit(_stem(member.name), '', member.offset_data, member.size))
      else:
        others += 1
    return units, others
  if layout in ('tars', 'folders'):
    units, others = [], 0
    for entry in _visible(root):
      if layout == 'tars' and entry.is_file() and entry.name.lower().endswith('.tar'):
        units.append(Unit(_stem(entry.name), entry.name, 0, entry.stat().st_size))
      elif layout == 'folders' and entry.is_dir():
        units.append(Unit(entry.name, entry.name, 0, 0))
      else:
        others += 1
    return units, others
  if layout == 'flat_tar':
    return [Unit('', '', 0, os.path.getsize(root))], 0
  if layout == 'flat_folder':
    return [Unit('', '', 0, 0)], 0
  raise ValueError(f'unknown layout {layout!r}: one of {LAYOUTS}')


def fingerprint(root: str, layout: str) -> List[list]:
  """What the index of the source at `root` is built from: [name, size, mtime_ns] of the archive
  (single-file layouts), of each tar, or of each class folder (whose time changes when an image
  is added, removed or renamed)."""
  if layout in ('tar_of_tars', 'flat_tar'):
    st = os.stat(root)
    return [[os.path.basename(root), st.st_size, st.st_mtime_ns]]
  if layout == 'flat_folder':
    st = os.stat(root)
    return [['', 0, st.st_mtime_ns]]
  out = []
  for entry in _visible(root):
    st = entry.stat()
    out.append([entry.name, 0 if entry.is_dir() else st.st_size, st.st_mtime_ns])
  return out


# ---------------------------------------------------------------------------------------------
# Reading tar headers inside a byte range of a file.


class _Window(io.RawIOBase):
  """Bytes [start, start + size) of an open file, as a seekable file."""

  def __init__(self, f, start: int, size: int):
    super().__init__()
    self._f, self._start, self._size, self._pos = f, start, size, 0

  def readable(self):
    return True

  def seekable(self):
    return True

  def tell(self):
    return self._pos

  def seek(self, pos, whence=0):
    self._pos = {0: pos, 1: self._pos + pos, 2: self._size + pos}[whence]
    return self._pos

  def readinto(self, buffer):
    n = max(0, min(len(buffer), self._size - self._pos))
    self._f.seek(self._start + self._pos)
    data = self._f.read(n)
    buffer[:len(data)] = data
    self._pos += len(data)
    return len(data)


def _members(path: str, size: int, start: int, shown: str):
  """The regular-file members of the tar at bytes [start, start + size) of `path`, offsets
  relative to `start`; UserError if it is not a tar or is cut short."""
  with open(path, 'rb') as f:
    window = io.BufferedReader(_Window(f, start, size), 1 << 16)
    try:
      tar = tarfile.open(fileobj=window, mode='r:')
      members = [m for m in tar if m.isfile()]
      end = tar.offset
    except (tarfile.TarError, EOFError) as e:
      what = 'is truncated' if 'unexpected end' in str(e) else 'is not a readable tar'
      raise UserError(f'{shown} {what} ({e}): download it again') from None
    for m in members:
      if m.offset_data + m.size > size:
        raise UserError(f'{shown} is truncated: its member {m.name} needs bytes up to '
                        f'{start + m.offset_data + m.size} of a {start + size}-byte range; '
                        f'download it again')
    window.seek(end)
    tail = window.read(_BLOCK)
    if len(tail) < _BLOCK or tail.strip(b'\0'):
      raise UserError(f'{shown} is truncated or damaged after byte {start + end} (no end-of-'
                      f'archive block); download it again')
  return members


# ---------------------------------------------------------------------------------------------
# One unit -> one part file.


def _index_unit(task) -> Tuple[int, int, Optional[str]]:
  """Indexes unit `k` into its part file; (k, non-image members, error message or None)."""
  root, layout, k, unit, file_id, part = task
  try:
    names, file_ids, offsets, sizes, others = [], [], [], [], 0
    if layout in ('folders', 'flat_folder'):
      base = _under(root, unit.file)
      for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
        for fn in sorted(f for f in filenames if not f.startswith('.')):
          rel = os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, '/')
          if not _is_image(fn):
            others += 1
            continue
          names.append(rel)
          file_ids.append(-1)
          offsets.append(0)
          sizes.append(os.path.getsize(os.path.join(dirpath, fn)))
    else:
      path = _under(root, unit.file)
      shown = f'{path}:{unit.name}.tar' if layout == 'tar_of_tars' else path
      for m in _members(path, unit.size, unit.offset, shown):
        if not _is_image(m.name):
          others += 1
          continue
        names.append(f'{unit.name}/{m.name}' if unit.name else m.name)
        file_ids.append(file_id)
        offsets.append(unit.offset + m.offset_data)
        sizes.append(m.size)
    order = sorted(range(len(names)), key=names.__getitem__)
    encoded = [names[i].encode('utf-8', 'surrogateescape') for i in order]
    tmp = f'{part}.{os.getpid()}.tmp.npz'
    np.savez(tmp, file_id=np.asarray([file_ids[i] for i in order], np.int32).reshape(-1),
             offset=np.asarray([offsets[i] for i in order], np.int64).reshape(-1),
             size=np.asarray([sizes[i] for i in order], np.int64).reshape(-1),
             names=np.frombuffer(b''.join(encoded), np.uint8),
             name_lengths=np.asarray([len(e) for e in encoded], np.int64).reshape(-1),
             others=np.int64(others), unit=np.asarray(json.dumps(dataclasses.astuple(unit))))
    os.replace(tmp, part)
    return k, others, None
  except UserError as e:
    return k, 0, str(e)
  except OSError as e:
    return k, 0, f'cannot read {os.path.join(root, unit.file)}: {e.strerror or e}'


# ---------------------------------------------------------------------------------------------
# Building and loading.


def index_dir(root: str, layout: str, base: str) -> str:
  """The index's directory under `base`: named by the source's path, so that an index of a
  changed source is found (and refused), never a stale one silently skipped."""
  slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(root))) or 'root'
  digest = hashlib.sha256(f'{os.path.abspath(root)}\0{layout}'.encode()).hexdigest()[:12]
  return os.path.join(base, f'{slug}-{digest}')


def _write_json(path: str, value) -> None:
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f)
  os.replace(tmp, path)


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class _Progress:
  """'indexing SOURCE: done/total units, elapsed, ETA' on stderr: redrawn in place on a
  terminal, otherwise a line at most every 10 s and at the end."""

  def __init__(self, what: str, total: int, done: int):
    self._what, self._total, self._done = what, total, done
    self._start_done, self._t0, self._last = done, time.monotonic(), 0.0
    self._tty = sys.stderr.isatty()

  def step(self, n: int = 1) -> None:
    self._done += n
    now = time.monotonic()
    if self._done < self._total and now - self._last < (0.2 if self._tty else 10):
      return
    self._last = now
    rate = (self._done - self._start_done) / max(now - self._t0, 1e-9)
    left = (self._total - self._done) / rate if rate > 0 else 0
    line = (f'indexing {self._what}: {self._done}/{self._total} units, '
            f'{_clock(now - self._t0)} elapsed, ETA {_clock(left)}')
    end = '\n' if self._done >= self._total or not self._tty else ''
    print(('\r' if self._tty else '') + line, end=end, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
  s = int(seconds + 0.5)
  return f'{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}'


def build(root: str, layout: str, base: str, *, shard: Tuple[int, int] = (0, 1),
          workers: Optional[int] = None, wait_s: float = 3600.0,
          on_part: Optional[Callable[[int], None]] = None) -> str:
  """Indexes the source at `root` into `index_dir(root, layout, base)` if that is not done yet
  and returns the directory (see the module docstring). `shard=(i, n)`: this host indexes units
  i, i + n, ... and waits up to `wait_s` for the others' parts; `workers`: processes (default:
  one per usable core); `on_part(k)` is called after part k is written."""
  directory = index_dir(root, layout, base)
  now = fingerprint(root, layout)
  meta = _read_json(os.path.join(directory, 'meta.json'))
  if meta is not None and meta.get('format') == FORMAT:
    _check_unchanged(meta, now, root, directory)
    if _read_json(os.path.join(directory, 'done.json')) == meta['fingerprint']:
      return directory
    units = [Unit(*u) for u in meta['units']]
  else:
    units, others = list_units(root, layout)
    files = sorted({u.file for u in units}) if layout not in ('folders', 'flat_folder') else []
    os.makedirs(os.path.join(directory, 'parts'), exist_ok=True)
    meta = json.loads(json.dumps(dict(  # as read back: lists, not tuples
        format=FORMAT, root=os.path.abspath(root), layout=layout, fingerprint=now,
        units=[dataclasses.astuple(u) for u in units], files=files, others=others)))
    _write_json(os.path.join(directory, 'meta.json'), meta)
  part = lambda k: os.path.join(directory, 'parts', f'{k:07d}.npz')
  index, count = shard
  mine = [k for k in range(index, len(units), count) if not os.path.exists(part(k))]
  progress = _Progress(root, len(range(index, len(units), count)),
                       len(range(index, len(units), count)) - len(mine))
  file_ids = {name: i for i, name in enumerate(meta['files'])}
  tasks = [(root, layout, k, units[k], file_ids.get(units[k].file, -1), part(k)) for k in mine]
  n = min(workers or cpus.usable(), len(tasks))
  with contextlib.ExitStack() as stack:
    if n <= 1:
      results = map(_index_unit, tasks)
    else:
      pool = stack.enter_context(multiprocessing.get_context('spawn').Pool(n))
      results = pool.imap_unordered(_index_unit, tasks)
    for k, _, error in results:
      if error:
        raise UserError(error)
      progress.step()
      if on_part:
        on_part(k)
  deadline = time.monotonic() + wait_s
  while not all(os.path.exists(part(k)) for k in range(len(units))):
    if time.monotonic() > deadline:
      raise UserError(f'the index in {directory} still misses parts of other hosts after '
                      f'{wait_s:.0f} s: run every host of the job (or one with shard 0/1)')
    time.sleep(2.0)
  _merge(directory, meta, [part(k) for k in range(len(units))])
  return directory


def _check_unchanged(meta: dict, now: list, root: str, directory: str) -> None:
  if meta['fingerprint'] != now:
    then = {e[0]: e[1:] for e in meta['fingerprint']}
    changed = [e[0] for e in now if then.get(e[0]) != e[1:]] + sorted(
        set(then) - {e[0] for e in now})
    raise UserError(f'the index in {directory} was built from other contents of {root} '
                    f'({len(changed)} changed: {", ".join(map(str, changed[:3])) or "the root"}):'
                    f' delete that directory to index the source again')


def _merge(directory: str, meta: dict, parts: Sequence[str]) -> None:
  """The parts -> one set of arrays (written atomically), then done.json."""
  columns = {key: [] for key in ('file_id', 'offset', 'size', 'names', 'name_lengths', 'unit')}
  others = meta['others']
  for k, path in enumerate(parts):
    with np.load(path) as part:
      if json.loads(str(part['unit'])) != meta['units'][k]:
        raise UserError(f'part {path} of the index in {directory} indexes another unit: delete '
                        f'{directory} to index the source again')
      for key in ('file_id', 'offset', 'size', 'names', 'name_lengths'):
        columns[key].append(part[key])
      columns['unit'].append(np.full(len(part['file_id']), k, np.int32))
      others += int(part['others'])
  arrays = {key: np.concatenate(value) if value else np.zeros([0], np.int64)
            for key, value in columns.items()}
  arrays['name_ends'] = np.cumsum(arrays.pop('name_lengths')).astype(np.int64)
  arrays['hash_order'] = _hash_order(arrays['names'], arrays['name_ends'])
  tmp = os.path.join(directory, f'index.{os.getpid()}.tmp.npz')
  np.savez(tmp, skipped_non_images=np.int64(others), **arrays)
  os.replace(tmp, os.path.join(directory, 'index.npz'))
  _write_json(os.path.join(directory, 'done.json'), meta['fingerprint'])


def load(root: str, layout: str, base: str, **build_kwargs) -> Index:
  """The index of the source at `root`, built first if needed (`build`)."""
  directory = build(root, layout, base, **build_kwargs)
  meta = _read_json(os.path.join(directory, 'meta.json'))
  with np.load(os.path.join(directory, 'index.npz')) as a:
    return Index(root=root, layout=layout, units=tuple(u[0] for u in meta['units']),
                 files=tuple(meta['files']), unit=a['unit'].astype(np.int32),
                 file=a['file_id'].astype(np.int32), offset=a['offset'].astype(np.int64),
                 size=a['size'].astype(np.int64), names=a['names'].astype(np.uint8),
                 name_ends=a['name_ends'], hash_order=a['hash_order'],
                 skipped_non_images=int(a['skipped_non_images']))


__all__ = ['IMAGE_EXTENSIONS', 'Index', 'LAYOUTS', 'Unit', 'build', 'fingerprint', 'index_dir',
           'list_units', 'load']
