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

What is read (`list_units`, `_walk`, `_members`):
  - entries whose name starts with '.' are ignored (in folders and in tars);
  - beside the units, an entry that is no unit (a file, a tar or folder whose name the source's
    `unit_name` rule refuses, e.g. 'backup_n01440764.tar' among synsets) is a *stray*: named in
    the index's notes, never read;
  - inside a unit, files without a JPEG/PNG extension are *non-images* (named, left out); a
    symbolic link to a folder is followed only when it leads to a folder inside its unit that
    was not read yet, so a loop ('again -> .') or a link out of the unit is *not followed*
    (named); entries that cannot be listed or stat'ed, dangling links and special files are
    *unreadable* (named); a file reached twice (two links to it, or a hard link) is read once,
    under its first name, the others named as *duplicates*; a tar member stored twice under one
    name is read once (the last copy, as `tar x` leaves it), the earlier named;
  - two units that are the same folder or file, or one inside another, and a file reached from
    two units, are refused (`UserError`): an image has one class.

Building (`build`) lists the units once, then indexes them in parallel (one process per usable
core, from `_POOL_FROM` units on) into one part file per unit, each written atomically, so a run killed while indexing does
only the missing parts when rerun; several hosts sharing the index directory split the units by
`shard=(index, count)`, each writing its own parts, and all merge when every part exists. A
progress line with an ETA goes to stderr. SIGTERM, SIGHUP or Ctrl-C while indexing stop the
workers and raise one `UserError` line (the parts written are kept; nothing half-written is
ever read as a part). Nothing decodes the images here (a corrupt image is found, and skipped,
when the input pipeline decodes it).

The index records what it was built from (`fingerprint`: the size and modification time of each
archive, or each class folder; with `deep=True`, of every file): an index whose source has
changed since is refused with a `UserError`, never reused (with `deep=True` a changed source gets
a new index instead). It also records a *content* digest: every image's name, size and the CRC-32
of its last `TAIL_BYTES` bytes (read beside the tar headers the index reads anyway), so that
another archive with the same classes and counts is other data, while a copy of the same files
elsewhere is the same data.

Indexes are written under `index_base(data_dir)`: $VIT_JAX_INDEX_DIR, else
`<data_dir>/vit_jax_index`.

Reading (`Index.read`) checks that the file is the one indexed: an archive whose size or
modification time changed (overwritten in place), that is gone or replaced, cannot be opened, or
an image file whose size changed raises `ReadError` (a `UserError` naming the file and the fix),
never bytes that are not the indexed image's.
"""

import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import multiprocessing
import os
import re
import signal
import stat
import sys
import tarfile
import threading
import time
import zlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax.platform import cpus
from vit_jax.errors import UserError

LAYOUTS = ('tar_of_tars', 'tars', 'folders', 'flat_tar', 'flat_folder')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
FORMAT = 2  # of the index files; an index of another format is built again
DIR_VAR = 'VIT_JAX_INDEX_DIR'  # where indexes are written, instead of <data_dir>/vit_jax_index
TAIL_BYTES = 64  # of each image, checksummed into the content digest
NOTE_KINDS = ('stray', 'non_image', 'not_followed', 'unreadable', 'duplicate')
_BLOCK = 512  # tar block size
_POOL_FROM = 16  # units from which indexing runs in a pool of processes (unless told)
_PATH_CHECK_S = 1.0  # how often a read checks that an archive's path still names the indexed file


class ReadError(UserError):
  """An indexed image that cannot be read as indexed (the message names the file and the fix)."""


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
  directory: str             # where the index is stored
  units: Tuple[str, ...]     # unit names, in source order
  files: Tuple[str, ...]     # the files the rows read (relative to root); file -1: the own file
  file_stats: Tuple[Tuple[int, int], ...]  # (size, mtime_ns) of each of `files` when indexed
  unit: np.ndarray           # int32 [N]
  file: np.ndarray           # int32 [N]
  offset: np.ndarray         # int64 [N]
  size: np.ndarray           # int64 [N]
  names: np.ndarray          # uint8: the names, '/'-joined, back to back
  name_ends: np.ndarray      # int64 [N]
  hash_order: np.ndarray     # int64 [N]: the rows by the SHA-256 of their names (`_hash_order`)
  notes: Dict[str, List[str]]  # kind (NOTE_KINDS) -> the names of what was left out, and why
  content: str               # digest of every image's name, size and last bytes
  built: bool = False        # whether this process wrote (part of) the index
  _fds: dict = dataclasses.field(default_factory=dict, repr=False)  # file -> open descriptor
  _checked: dict = dataclasses.field(default_factory=dict, repr=False)  # file -> path check time

  def __len__(self) -> int:
    return len(self.unit)

  @property
  def skipped_non_images(self) -> int:
    return len(self.notes.get('non_image', ()))

  def read(self, row: int) -> bytes:
    """The bytes of image `row`, read in place; `ReadError` if its file is not as indexed."""
    f, size = int(self.file[row]), int(self.size[row])
    path = self.path(row)
    try:
      if f < 0:
        with open(path, 'rb') as own:
          found = os.fstat(own.fileno())
          if not stat.S_ISREG(found.st_mode) or found.st_size != size:
            raise self._changed(row, path, f'{found.st_size} bytes, indexed with {size}')
          data = own.read(size)
      else:
        fd = self._open(f, path)
        data = os.pread(fd, size, int(self.offset[row]))
    except OSError as e:
      raise self._unreadable(row, path, e) from None
    if len(data) != size:
      raise self._changed(row, path, f'{len(data)} of its {size} bytes could be read')
    return data

  def _open(self, f: int, path: str) -> int:
    """The open descriptor of file `f`, checked against what was indexed."""
    fd = self._fds.get(f)
    if fd is None:
      opened = os.open(path, os.O_RDONLY)
      fd = self._fds.setdefault(f, opened)
      if fd != opened:
        os.close(opened)
    found = os.fstat(fd)
    indexed = self.file_stats[f]
    if (found.st_size, found.st_mtime_ns) != tuple(indexed):
      raise self._changed(None, path, f'size {found.st_size}, modified {_when(found)}; '
                                      f'indexed with size {indexed[0]}')
    now = time.monotonic()
    if now - self._checked.get(f, -1e9) > _PATH_CHECK_S:  # gone or replaced under its name?
      at_path = os.stat(path)
      if (at_path.st_dev, at_path.st_ino) != (found.st_dev, found.st_ino):
        raise self._changed(None, path, 'another file is there now')
      self._checked[f] = now
    return fd

  def _changed(self, row: Optional[int], path: str, what: str) -> ReadError:
    image = f' (reading {self.name(row)})' if row is not None else ''
    return ReadError(f'{path} changed since it was indexed{image}: {what}. Put the files back '
                     f'as they were and rerun the same command to resume; to use the new '
                     f'contents, delete {self.directory} and start a new --workdir')

  def _unreadable(self, row: int, path: str, error: OSError) -> ReadError:
    reason = error.strerror or str(error)
    fix = {errno.ENOENT: 'it is gone: put it back', errno.EACCES: 'fix its permissions',
           errno.EPERM: 'fix its permissions'}.get(error.errno, 'check the disk')
    return ReadError(f'cannot read {path} ({reason}; reading {self.name(row)}): {fix}, then '
                     f'rerun the same command to resume')

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


def _when(st: os.stat_result) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st.st_mtime))


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


def index_base(data_dir: str) -> str:
  """Where indexes are written: $VIT_JAX_INDEX_DIR, else `<data_dir>/vit_jax_index`."""
  return os.path.expanduser(os.environ.get(DIR_VAR) or os.path.join(data_dir, 'vit_jax_index'))


# ---------------------------------------------------------------------------------------------
# Units, strays and fingerprints.


def _is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_EXTENSIONS)


def _hidden(name: str) -> bool:
  return name.rstrip('/').rsplit('/', 1)[-1].startswith('.')


def _stem(name: str) -> str:
  base = name.rstrip('/').rsplit('/', 1)[-1]
  return base[:-4] if base.lower().endswith('.tar') else base


def _visible(root: str) -> List[os.DirEntry]:
  return sorted((e for e in os.scandir(root) if not e.name.startswith('.')), key=lambda e: e.name)


def _inside(path: str, folder: str) -> bool:
  """Whether real path `path` is `folder` or under it."""
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _notes() -> Dict[str, List[str]]:
  return {kind: [] for kind in NOTE_KINDS}


def list_units(root: str, layout: str,
               unit_name: Optional[Callable[[str], bool]] = None
               ) -> Tuple[List[Unit], Dict[str, List[str]]]:
  """(units in source order, notes) of the source at `root`: entries beside the units that are
  none (or whose name `unit_name` refuses) are strays; folder units that are the same folder, or
  one inside another, are refused."""
  accept = unit_name or (lambda name: True)
  notes = _notes()
  units = []
  if layout == 'tar_of_tars':
    for member in _members(root, os.path.getsize(root), 0, root, notes):
      if member.name.lower().endswith('.tar') and accept(_stem(member.name)):
        units.append(Unit(_stem(member.name), '', member.offset_data, member.size))
      else:
        notes['stray'].append(member.name)
  elif layout in ('tars', 'folders'):
    for entry in _visible(root):
      try:
        is_tar = entry.is_file() and entry.name.lower().endswith('.tar')
        is_dir = entry.is_dir()
      except OSError:
        is_tar = is_dir = False
      if is_dir and _inside(os.path.realpath(root), os.path.realpath(entry.path)):
        notes['not_followed'].append(entry.name)  # a link to the root or above: a loop
      elif layout == 'tars' and is_tar and accept(_stem(entry.name)):
        units.append(Unit(_stem(entry.name), entry.name, 0, entry.stat().st_size))
      elif layout == 'folders' and is_dir and accept(entry.name):
        units.append(Unit(entry.name, entry.name, 0, 0))
      else:
        notes['stray'].append(entry.name)
    _refuse_shared(root, units)
  elif layout == 'flat_tar':
    units.append(Unit('', '', 0, os.path.getsize(root)))
  elif layout == 'flat_folder':
    units.append(Unit('', '', 0, 0))
  else:
    raise ValueError(f'unknown layout {layout!r}: one of {LAYOUTS}')
  names = [u.name for u in units]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise UserError(f'{root} holds class {twice[0]} twice '
                    f'({", ".join(u.file for u in units if u.name == twice[0])}): keep one')
  return units, notes


def _refuse_shared(root: str, units: Sequence[Unit]) -> None:
  """UserError if two units are one file or folder (links), or one folder holds another."""
  owner = {}
  for unit in units:
    real = os.path.realpath(_under(root, unit.file))
    if real in owner:
      _shared(root, owner[real], unit.file, 'are the same')
    owner[real] = unit.file
  for real, name in owner.items():
    parent = os.path.dirname(real)
    while parent != os.path.dirname(parent):
      if parent in owner:
        _shared(root, owner[parent], name, 'hold the same images (one is inside the other)')
      parent = os.path.dirname(parent)


def _shared(root: str, first: str, second: str, how: str) -> None:
  raise UserError(f'{_under(root, first)} and {_under(root, second)} {how} (a symbolic link): an '
                  f'image has one class; remove the link')


def fingerprint(root: str, layout: str, deep: bool = False):
  """What the index of the source at `root` is built from: [name, size, mtime_ns] of the archive
  (single-file layouts), of each tar, or of each class folder (whose time changes when an image
  is added, removed or renamed). `deep`: a digest of every file and folder the index would read
  (name, size, mtime), so a file rewritten in place or changed in a nested folder counts too."""
  if layout in ('tar_of_tars', 'flat_tar'):
    st = os.stat(root)
    return [[os.path.basename(root), st.st_size, st.st_mtime_ns]]
  if deep:
    units, notes = list_units(root, layout)
    listing = [notes]
    for unit in units:
      walked = _walk(root, unit)
      listing.append([unit.name, [[rel, st.st_size, st.st_mtime_ns] for rel, st in walked[0]],
                      walked[1]])
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]
  if layout == 'flat_folder':
    st = os.stat(root)
    return [['', 0, st.st_mtime_ns]]
  out = []
  for entry in _visible(root):
    try:
      st = entry.stat()
    except OSError:  # a dangling link: a stray, listed by its name
      out.append([entry.name, -1, -1])
      continue
    out.append([entry.name, 0 if entry.is_dir() else st.st_size, st.st_mtime_ns])
  return out


# ---------------------------------------------------------------------------------------------
# Walking a folder unit.


def _walk(root: str, unit: Unit) -> Tuple[List[Tuple[str, os.stat_result]], Dict[str, list]]:
  """([(relative name, stat)] of the image files of a folder unit, sorted; notes), by the rules
  in the module docstring (links to folders followed only inside the unit, each file once)."""
  notes = _notes()
  base = _under(root, unit.file)
  real_base = os.path.realpath(base)
  seen_dirs = {_identity(os.stat(base))}
  found, pending = [], [unit.file]
  while pending:
    rel_dir = pending.pop()
    try:
      entries = sorted(os.scandir(_under(root, rel_dir)), key=lambda e: e.name)
    except OSError:
      notes['unreadable'].append(rel_dir)
      continue
    for entry in entries:
      if entry.name.startswith('.'):
        continue
      rel = f'{rel_dir}/{entry.name}' if rel_dir else entry.name
      try:
        if entry.is_dir():  # follows links
          if entry.is_symlink() and not _inside(os.path.realpath(entry.path), real_base):
            notes['not_followed'].append(rel)  # leads out of the unit
            continue
          identity = _identity(os.stat(entry.path))
          if identity in seen_dirs:
            notes['not_followed'].append(rel)  # a loop, or a second way into a folder
            continue
          seen_dirs.add(identity)
          pending.append(rel)
        elif entry.is_file():
          if not _is_image(entry.name):
            notes['non_image'].append(rel)
            continue
          found.append((rel, os.stat(entry.path), entry.is_symlink()))
        else:
          notes['unreadable'].append(rel)  # a dangling or looping link, a socket, a device, ...
      except OSError:
        notes['unreadable'].append(rel)
  linked = {_identity(st) for _, st, link in found if link or st.st_nlink > 1}
  files, first = [], {}
  for rel, st, link in sorted(found, key=lambda item: (item[2], item[0])):  # links last
    if _identity(st) in linked:
      if _identity(st) in first:
        notes['duplicate'].append(f'{rel} (same file as {first[_identity(st)]})')
        continue
      first[_identity(st)] = rel
    files.append((rel, st))
  files.sort(key=lambda item: item[0])
  for kind in notes:
    notes[kind].sort()
  return files, notes


def _identity(st: os.stat_result) -> Tuple[int, int]:
  return st.st_dev, st.st_ino


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


def _members(path: str, size: int, start: int, shown: str, notes: Dict[str, list]):
  """The regular-file members of the tar at bytes [start, start + size) of `path`, offsets
  relative to `start`, one per name (the last copy); hidden members are left out, links and
  earlier copies noted. UserError if it is not a tar or is cut short."""
  with open(path, 'rb') as f:
    window = io.BufferedReader(_Window(f, start, size), 1 << 16)
    try:
      tar = tarfile.open(fileobj=window, mode='r:')
      members = list(tar)
      end = tar.offset
    except (tarfile.TarError, EOFError) as e:
      what = 'is truncated' if 'unexpected end' in str(e) else 'is not a readable tar'
      raise UserError(f'{shown} {what} ({e}): download it again') from None
    for m in members:
      if m.isfile() and m.offset_data + m.size > size:
        raise UserError(f'{shown} is truncated: its member {m.name} needs bytes up to '
                        f'{start + m.offset_data + m.size} of a {start + size}-byte range; '
                        f'download it again')
    window.seek(end)
    tail = window.read(_BLOCK)
    if len(tail) < _BLOCK or tail.strip(b'\0'):
      raise UserError(f'{shown} is truncated or damaged after byte {start + end} (no end-of-'
                      f'archive block); download it again')
  last = {}
  for m in members:
    if _hidden(m.name) or m.isdir():
      continue
    if m.issym() or m.islnk():
      notes['not_followed'].append(m.name)
    elif not m.isfile():
      notes['unreadable'].append(m.name)
    else:
      if m.name in last:
        notes['duplicate'].append(m.name)
      last[m.name] = m
  return sorted(last.values(), key=lambda m: m.offset)


# ---------------------------------------------------------------------------------------------
# One unit -> one part file.


def _tail_crc(fd: int, offset: int, size: int) -> int:
  n = min(size, TAIL_BYTES)
  return zlib.crc32(os.pread(fd, n, offset + size - n)) if n else 0


def _index_unit(task) -> Tuple[int, Optional[str]]:
  """Indexes unit `k` into its part file; (k, error message or None)."""
  root, layout, k, unit, file_id, part = task
  try:
    names, file_ids, offsets, sizes, tails, links = [], [], [], [], [], []
    if layout in ('folders', 'flat_folder'):
      files, notes = _walk(root, unit)
      real_root = os.path.realpath(root)
      for rel, st in files:
        fd = os.open(_under(root, rel), os.O_RDONLY)
        try:
          tails.append(_tail_crc(fd, 0, st.st_size))
        finally:
          os.close(fd)
        names.append(rel)
        file_ids.append(-1)
        offsets.append(0)
        sizes.append(st.st_size)
        if os.path.islink(_under(root, rel)) or st.st_nlink > 1:
          real = os.path.realpath(_under(root, rel))
          home = (os.path.relpath(real, real_root) if _inside(real, real_root) else None)
          links.append([rel, st.st_ino, st.st_size, home])
    else:
      path = _under(root, unit.file)
      shown = f'{path}:{unit.name}.tar' if layout == 'tar_of_tars' else path
      notes = _notes()
      members = _members(path, unit.size, unit.offset, shown, notes)
      fd = os.open(path, os.O_RDONLY)
      try:
        for m in members:
          name = f'{unit.name}/{m.name}' if unit.name else m.name
          if not _is_image(m.name):
            notes['non_image'].append(name)
            continue
          names.append(name)
          file_ids.append(file_id)
          offsets.append(unit.offset + m.offset_data)
          sizes.append(m.size)
          tails.append(_tail_crc(fd, unit.offset + m.offset_data, m.size))
      finally:
        os.close(fd)
      notes = {kind: [n if kind == 'non_image' or not unit.name else f'{unit.name}/{n}'
                      for n in names_] for kind, names_ in notes.items()}
  except UserError as e:
    return k, str(e)
  except OSError as e:
    return k, f'cannot read {_under(root, unit.file)} ({e.strerror or e}): check it, then rerun'
  order = sorted(range(len(names)), key=names.__getitem__)
  encoded = [names[i].encode('utf-8', 'surrogateescape') for i in order]
  digest = hashlib.sha256()
  for i, name in zip(order, encoded):
    digest.update(name + b'\0' + np.int64(sizes[i]).tobytes() + np.uint32(tails[i]).tobytes())
  tmp = f'{part}.{os.getpid()}.tmp.npz'
  try:
    np.savez(tmp, file_id=np.asarray([file_ids[i] for i in order], np.int32).reshape(-1),
             offset=np.asarray([offsets[i] for i in order], np.int64).reshape(-1),
             size=np.asarray([sizes[i] for i in order], np.int64).reshape(-1),
             names=np.frombuffer(b''.join(encoded), np.uint8),
             name_lengths=np.asarray([len(e) for e in encoded], np.int64).reshape(-1),
             unit=np.asarray(json.dumps(dataclasses.astuple(unit))),
             notes=np.asarray(json.dumps(notes)), links=np.asarray(json.dumps(links)),
             digest=np.asarray(digest.hexdigest()))
    os.replace(tmp, part)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    return k, write_failure(e, os.path.dirname(os.path.dirname(part)))
  return k, None


_WRITE_FIXES = {
    errno.ENOSPC: 'free space there or set ${var} to a directory with room',
    errno.EDQUOT: 'free space (or raise the quota) there or set ${var} to a directory with room',
    errno.EROFS: 'set ${var} to a directory on a writable file system',
    errno.EACCES: 'fix its permissions or set ${var} to a directory you can write',
    errno.EPERM: 'fix its permissions or set ${var} to a directory you can write',
}


def write_failure(error: OSError, directory: str) -> str:
  """One line for an index that cannot be written: the place, and how to move the index."""
  fix = _WRITE_FIXES.get(error.errno, 'set ${var} to another directory').format(var=DIR_VAR)
  return (f'cannot write the index in {directory} ({error.strerror or error}): {fix} (the index '
          f'is small; the images stay where they are), then rerun the same command')


# ---------------------------------------------------------------------------------------------
# Building and loading.


def index_dir(root: str, layout: str, base: str, tag: str = '') -> str:
  """The index's directory under `base`: named by the source's path (and `tag`), so that an
  index of a changed source is found (and refused), never a stale one silently skipped."""
  slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(root)))[:64] or 'root'
  digest = hashlib.sha256(f'{os.path.abspath(root)}\0{layout}'.encode(
      'utf-8', 'surrogateescape')).hexdigest()[:12]
  return os.path.join(base, f'{slug}-{digest}{f"-{tag}" if tag else ""}')


def write_json(path: str, value) -> None:
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w') as f:
    json.dump(value, f)
  os.replace(tmp, path)


def read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class _Progress:
  """'indexing SOURCE: done/total units, elapsed, ETA' on stderr once indexing has taken
  `_QUIET_S` (a small source says nothing): redrawn in place on a terminal, otherwise a line at
  most every 10 s, and at the end."""

  _QUIET_S = 5.0

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
    rate = (self._done - self._start_done) / max(now - self._t0, 1e-9)
    left = (self._total - self._done) / rate if rate > 0 else 0
    line = (f'indexing {self._what}: {self._done}/{self._total} units, '
            f'{_clock(now - self._t0)} elapsed, ETA {_clock(left)}')
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
      return directory, False
    units = [Unit(*u) for u in meta['units']]
  else:
    stale = meta is not None  # an index of another format: its parts would not fit
    units, notes = list_units(root, layout, unit_name)
    files = [] if layout in ('folders', 'flat_folder') else sorted({u.file for u in units})
    stats = [os.stat(_under(root, f)) for f in files]
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
        results = map(_index_unit, tasks)
      else:
        _start_resource_tracker()
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(
            n, mp_context=multiprocessing.get_context('spawn'), initializer=_worker_start))
        stack.callback(_stop_workers, pool)
        results = (f.result() for f in concurrent.futures.as_completed(
            [pool.submit(_index_unit, t) for t in tasks]))
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
    raise UserError(f'the index in {directory} was built from other contents of {root} '
                    f'({len(changed)} changed: {", ".join(map(str, changed[:3])) or "the root"}):'
                    f' delete that directory to index the source again')


def _merge(directory: str, meta: dict, parts: Sequence[str]) -> None:
  """The parts -> one set of arrays (written atomically), then done.json (with the notes and
  the content digest); UserError for a file reached from two units."""
  columns = {key: [] for key in ('file_id', 'offset', 'size', 'names', 'name_lengths', 'unit')}
  notes = {kind: list(meta['notes'].get(kind, [])) for kind in NOTE_KINDS}
  content = hashlib.sha256()
  owner = {}  # (inode, size) of a linked file -> its name
  unit_files = {u[1] for u in meta['units']} - {''}
  for k, path in enumerate(parts):
    with np.load(path) as part:
      if json.loads(str(part['unit'])) != meta['units'][k]:
        raise UserError(f'part {path} of the index in {directory} indexes another unit: delete '
                        f'{directory} to index the source again')
      for key in ('file_id', 'offset', 'size', 'names', 'name_lengths'):
        columns[key].append(part[key])
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
  tmp = os.path.join(directory, f'index.{os.getpid()}.tmp.npz')
  np.savez(tmp, **arrays)
  os.replace(tmp, os.path.join(directory, 'index.npz'))
  write_json(os.path.join(directory, 'done.json'), dict(
      fingerprint=meta['fingerprint'], content=content.hexdigest()[:16], notes=notes))


def load(root: str, layout: str, base: str, **build_kwargs) -> Index:
  """The index of the source at `root`, built first if needed (`build`)."""
  directory, built = build(root, layout, base, **build_kwargs)
  meta = read_json(os.path.join(directory, 'meta.json'))
  done = read_json(os.path.join(directory, 'done.json'))
  with np.load(os.path.join(directory, 'index.npz')) as a:
    return Index(root=root, layout=layout, directory=directory,
                 units=tuple(u[0] for u in meta['units']),
                 files=tuple(meta['files']),
                 file_stats=tuple(tuple(s) for s in meta['file_stats']),
                 unit=a['unit'].astype(np.int32), file=a['file_id'].astype(np.int32),
                 offset=a['offset'].astype(np.int64), size=a['size'].astype(np.int64),
                 names=a['names'].astype(np.uint8), name_ends=a['name_ends'],
                 hash_order=a['hash_order'], notes=done['notes'], content=done['content'],
                 built=built)


__all__ = ['DIR_VAR', 'IMAGE_EXTENSIONS', 'Index', 'LAYOUTS', 'NOTE_KINDS', 'ReadError',
           'TAIL_BYTES', 'Unit', 'build', 'fingerprint', 'index_base', 'index_dir',
           'list_units', 'load', 'read_json', 'write_failure', 'write_json']
