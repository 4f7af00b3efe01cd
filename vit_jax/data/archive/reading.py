"""Reading an index: the bytes of each image, in place, checked against what was indexed.

`load` gives the `Index` of a source (built first if needed). `Index.read` checks that the file
is the one indexed: an archive whose size or modification time changed (overwritten in place),
that is gone or replaced, cannot be opened, or an image file whose size or modification time
changed (rewritten in place) raises
`ReadError` (a `UserError` naming the file and the fix), never bytes that are not the indexed
image's. A deflated zip member is inflated after its read and checked against the zip's CRC-32
of it: a damaged one is a `ReadError` naming it.
"""

import dataclasses
import errno
import os
import stat
import time
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from vit_jax.data.archive.building import build
from vit_jax.data.archive.indexing import damaged
from vit_jax.data.archive.layouts import DEFLATED, under
from vit_jax.data.archive.store import read_json
from vit_jax.errors import UserError

_PATH_CHECK_S = 1.0  # how often a read checks that an archive's path still names the indexed file


class ReadError(UserError):
  """An indexed image that cannot be read as indexed (the message names the file and the fix)."""


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
  mtime: np.ndarray          # int64 [N]: mtime_ns of an image's own file (0 in an archive)
  names: np.ndarray          # uint8: the names, '/'-joined, back to back
  name_ends: np.ndarray      # int64 [N]
  hash_order: np.ndarray     # int64 [N]: the rows by the SHA-256 of their names (`_hash_order`)
  notes: Dict[str, List[str]]  # kind (NOTE_KINDS) -> the names of what was left out, and why
  content: str               # digest of every image's name, size and CRC-32 of its bytes
  method: Optional[np.ndarray] = None    # int8 [N]: a zip member's method (None: no zip)
  data_crc: Optional[np.ndarray] = None  # uint32 [N]: the CRC-32 a zip records of its data
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
          if found.st_mtime_ns != int(self.mtime[row]):
            raise self._changed(row, path, f'rewritten (modified {_when(found)})')
          data = own.read(size)
      else:
        fd = self._open(f, path)
        data = os.pread(fd, size, int(self.offset[row]))
    except OSError as e:
      raise self._unreadable(row, path, e) from None
    if len(data) != size:
      raise self._changed(row, path, f'{len(data)} of its {size} bytes could be read')
    if self.method is not None and self.method[row] == DEFLATED:
      return self._inflate(row, path, data)
    return data

  def _inflate(self, row: int, path: str, data: bytes) -> bytes:
    """A deflated zip member's data, checked against the zip's CRC-32 of it."""
    inflate = zlib.decompressobj(-15)
    try:
      out = inflate.decompress(data)
    except zlib.error:
      out = None
    if out is None or not inflate.eof or zlib.crc32(out) != int(self.data_crc[row]):
      raise ReadError(damaged(path, self.name(row)))
    return out

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
    return under(self.root, self.files[f] if f >= 0 else os.fsdecode(self._name_bytes(row)))


def _when(st: os.stat_result) -> str:
  return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st.st_mtime))


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
                 mtime=a['mtime'].astype(np.int64),
                 names=a['names'].astype(np.uint8), name_ends=a['name_ends'],
                 hash_order=a['hash_order'], notes=done['notes'], content=done['content'],
                 method=a['method'] if 'method' in a.files else None,
                 data_crc=a['data_crc'] if 'data_crc' in a.files else None, built=built)



__all__ = ['Index', 'ReadError', 'load']
