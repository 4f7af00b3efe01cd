"""The five layouts of an image source, and what of each is read.

A *source* is one of six layouts (`LAYOUTS`), at a path:
  tar_of_tars   one tar whose members are per-class tars ('n01440764.tar') of images, as the
                ImageNet releases ship (fall11_whole.tar, ILSVRC2012_img_train.tar);
  tars          a folder of per-class tars;
  folders       a folder of per-class folders of images;
  flat_tar      one tar of images (ILSVRC2012_img_val.tar);
  flat_folder   a folder of images;
  flat_zip      one zip of images (ImageNet-Sketch.zip), its members stored or deflated.
Its *units* are the per-class tars or folders (one unit for the flat layouts).

What is read (`list_units`, `walk`, `tar_members`, `zip_members`):
  - entries whose name starts with '.' are ignored (in folders and in tars);
  - beside the units, an entry that is no unit (a file, a tar or folder whose name the source's
    `unit_name` rule refuses, e.g. 'backup_n01440764.tar' among synsets) is a *stray*: named in
    the index's notes, never read;
  - inside a unit, files without a JPEG/PNG extension are *non-images* (named, left out); a
    symbolic link to a folder is followed only when it leads to a folder inside its unit that
    was not read yet, so a loop ('again -> .') or a link out of the unit is *not followed*
    (named); entries that cannot be listed or stat'ed, dangling links and special files are
    *unreadable* (named); folders inside a unit are read (their images belong to the unit) and
    watched like the unit (an image added to one is a change); a file reached twice (two links
    to it, or a hard link) is read once, under its first name, the others named as
    *duplicates*; a tar member stored twice under one name is read once (the last copy, as
    `tar x` leaves it), the earlier named (a per-class tar stored twice in a tar of tars,
    appended by `tar -r`, is named as such: *unit_twice*); a zip member likewise;
  - a zip member that is encrypted, or compressed by another method than deflate, is refused
    (`UserError`): the zip must be unpacked once;
  - two units that are the same folder or file, or one inside another, and a file reached from
    two units, are refused (`UserError`): an image has one class.

`fingerprint` is what an index is built from (sizes and modification times), so that an index
of a changed source is noticed.
"""

import dataclasses
import hashlib
import io
import json
import os
import struct
import tarfile
import zipfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from vit_jax.errors import UserError

LAYOUTS = ('tar_of_tars', 'tars', 'folders', 'flat_tar', 'flat_folder', 'flat_zip')
SINGLE_FILE = ('tar_of_tars', 'flat_tar', 'flat_zip')  # the layouts of one archive file
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
NOTE_KINDS = ('stray', 'non_image', 'not_followed', 'unreadable', 'duplicate', 'unit_twice')
_BLOCK = 512  # tar block size
GZIP_MAGIC = b'\x1f\x8b'  # the first bytes of every gzip file


@dataclasses.dataclass(frozen=True)
class Unit:
  """A per-class tar (`offset`, `size`: its bytes in `file`) or folder (`file` is its path)."""
  name: str
  file: str  # relative to the source's root ('' for the root itself)
  offset: int
  size: int



def under(root: str, rel: str) -> str:
  """`rel` under `root` ('' is `root` itself, a single-file source)."""
  return os.path.join(root, rel) if rel else root



def is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_EXTENSIONS)


def _hidden(name: str) -> bool:
  return name.rstrip('/').rsplit('/', 1)[-1].startswith('.')


def _stem(name: str) -> str:
  base = name.rstrip('/').rsplit('/', 1)[-1]
  return base[:-4] if base.lower().endswith('.tar') else base


def _visible(root: str) -> List[os.DirEntry]:
  return sorted((e for e in os.scandir(root) if not e.name.startswith('.')), key=lambda e: e.name)


def inside(path: str, folder: str) -> bool:
  """Whether real path `path` is `folder` or under it."""
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def empty_notes() -> Dict[str, List[str]]:
  return {kind: [] for kind in NOTE_KINDS}


def list_units(root: str, layout: str,
               unit_name: Optional[Callable[[str], bool]] = None
               ) -> Tuple[List[Unit], Dict[str, List[str]]]:
  """(units in source order, notes) of the source at `root`: entries beside the units that are
  none (or whose name `unit_name` refuses) are strays; folder units that are the same folder, or
  one inside another, are refused."""
  accept = unit_name or (lambda name: True)
  notes = empty_notes()
  units = []
  if layout == 'tar_of_tars':
    for member in tar_members(root, os.path.getsize(root), 0, root, notes):
      if member.name.lower().endswith('.tar') and accept(_stem(member.name)):
        units.append(Unit(_stem(member.name), '', member.offset_data, member.size))
      else:
        notes['stray'].append(member.name)
    # A per-class tar stored twice (appended later, as `tar -r` does) is no image there twice.
    notes['unit_twice'] = notes.pop('duplicate')
    notes['duplicate'] = []
  elif layout in ('tars', 'folders'):
    for entry in _visible(root):
      try:
        is_tar = entry.is_file() and entry.name.lower().endswith('.tar')
        is_dir = entry.is_dir()
      except OSError:
        is_tar = is_dir = False
      if is_dir and inside(os.path.realpath(root), os.path.realpath(entry.path)):
        notes['not_followed'].append(entry.name)  # a link to the root or above: a loop
      elif layout == 'tars' and is_tar and accept(_stem(entry.name)):
        units.append(Unit(_stem(entry.name), entry.name, 0, entry.stat().st_size))
      elif layout == 'folders' and is_dir and accept(entry.name):
        units.append(Unit(entry.name, entry.name, 0, 0))
      else:
        notes['stray'].append(entry.name)
    _refuse_shared(root, units)
  elif layout in ('flat_tar', 'flat_zip'):
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
    real = os.path.realpath(under(root, unit.file))
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
  raise UserError(f'{under(root, first)} and {under(root, second)} {how} (a symbolic link): an '
                  f'image has one class; remove the link')


def fingerprint(root: str, layout: str, deep: bool = False):
  """What the index of the source at `root` is built from: [name, size, mtime_ns] of the archive
  (single-file layouts), of each tar, or of each class folder (whose time changes when an image
  is added, removed or renamed; the folders inside a class folder are checked against the
  index's own list of them, building.py). `deep`: a digest of every file and folder the index
  would read (name, size, mtime), so a file rewritten in place or changed in a nested folder
  counts too."""
  if layout in SINGLE_FILE:
    st = os.stat(root)
    return [[os.path.basename(root), st.st_size, st.st_mtime_ns]]
  if deep:
    units, notes = list_units(root, layout)
    listing = [notes]
    for unit in units:
      walked = walk(root, unit)
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


def walk(root: str, unit: Unit) -> Tuple[List[Tuple[str, os.stat_result]], Dict[str, list],
                                         List[Tuple[str, os.stat_result]]]:
  """([(relative name, stat)] of the image files of a folder unit, sorted; notes; [(relative
  name, stat)] of the folders read inside it), by the rules in the module docstring (links to
  folders followed only inside the unit, each file once)."""
  notes = empty_notes()
  folders = []
  base = under(root, unit.file)
  real_base = os.path.realpath(base)
  seen_dirs = {_identity(os.stat(base))}
  found, pending = [], [unit.file]
  while pending:
    rel_dir = pending.pop()
    try:
      entries = sorted(os.scandir(under(root, rel_dir)), key=lambda e: e.name)
    except OSError:
      notes['unreadable'].append(rel_dir)
      continue
    for entry in entries:
      if entry.name.startswith('.'):
        continue
      rel = f'{rel_dir}/{entry.name}' if rel_dir else entry.name
      try:
        if entry.is_dir():  # follows links
          if entry.is_symlink() and not inside(os.path.realpath(entry.path), real_base):
            notes['not_followed'].append(rel)  # leads out of the unit
            continue
          identity = _identity(os.stat(entry.path))
          if identity in seen_dirs:
            notes['not_followed'].append(rel)  # a loop, or a second way into a folder
            continue
          seen_dirs.add(identity)
          folders.append((rel, os.stat(entry.path)))
          pending.append(rel)
        elif entry.is_file():
          if not is_image(entry.name):
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
  return files, notes, sorted(folders, key=lambda item: item[0])


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


def _compressed(path: str, start: int, shown: str) -> str:
  """The line for a gzip file where a tar is expected: images are read in place, at their
  offsets in the tar, which a compressed stream does not have."""
  fix = (f'decompress it (mv {path} {path}.gz && gunzip {path}.gz)' if start == 0 else
         'decompress it before packing it into the archive, or unpack the archive')
  return (f'{shown} is gzip-compressed (it starts with the gzip bytes 1f 8b), not a plain tar: '
          f'images are read in place from an uncompressed tar; {fix}, then rerun')


def tar_members(path: str, size: int, start: int, shown: str, notes: Dict[str, list]):
  """The regular-file members of the tar at bytes [start, start + size) of `path`, offsets
  relative to `start`, one per name (the last copy); hidden members are left out, links and
  earlier copies noted. UserError if it is not a tar, is compressed, or is cut short."""
  with open(path, 'rb') as f:
    window = io.BufferedReader(_Window(f, start, size), 1 << 16)
    if window.peek(2)[:2] == GZIP_MAGIC:
      raise UserError(_compressed(path, start, shown))
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
# Reading a zip's directory.

STORED, DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED  # the methods read in place
_LOCAL = struct.Struct('<4s5H3L2H')  # a local file header: signature ... name and extra lengths


@dataclasses.dataclass(frozen=True)
class ZipMember:
  """A zip member's data: bytes [offset, offset + size) of the zip, compressed by `method`
  (STORED or DEFLATED) from data whose CRC-32 is `crc`."""
  name: str
  offset: int
  size: int
  method: int
  crc: int


def _unpack_once(path: str) -> str:
  return (f'unpack it once (`unzip {os.path.basename(path)}` in {os.path.dirname(path) or "."})'
          f' and read the folder it unpacks into')


def zip_members(path: str, notes: Dict[str, list]) -> List[ZipMember]:
  """The file members of the zip `path` (its central directory; each data offset from its
  local header, whose name and extra field may differ in length from the directory's), one per
  name (the last copy), hidden members left out, earlier copies noted. UserError if it is no
  readable zip, is cut short, or holds a member encrypted or compressed by another method."""
  size = os.path.getsize(path)
  try:
    with open(path, 'rb') as f, zipfile.ZipFile(f) as z:
      infos = z.infolist()
      last = {}
      for info in infos:
        if info.is_dir() or _hidden(info.filename):
          continue
        if info.flag_bits & 0x1 or info.compress_type not in (STORED, DEFLATED):
          what = ('is encrypted' if info.flag_bits & 0x1 else
                  f'is compressed by method {info.compress_type}, not stored or deflated')
          raise UserError(f'{path}: its member {info.filename} {what}, which cannot be read in '
                          f'place: {_unpack_once(path)}')
        f.seek(info.header_offset)
        header = f.read(_LOCAL.size)
        if len(header) < _LOCAL.size or header[:4] != b'PK\x03\x04':
          raise UserError(f'{path} is truncated or damaged: no local header of its member '
                          f'{info.filename} at byte {info.header_offset}; download it again')
        fields = _LOCAL.unpack(header)
        offset = info.header_offset + _LOCAL.size + fields[-2] + fields[-1]
        if offset + info.compress_size > size:
          raise UserError(f'{path} is truncated: its member {info.filename} needs bytes up to '
                          f'{offset + info.compress_size} of {size}; download it again')
        if info.filename in last:
          notes['duplicate'].append(info.filename)
        last[info.filename] = ZipMember(info.filename, offset, info.compress_size,
                                        info.compress_type, info.CRC)
  except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
    raise UserError(f'{path} is not a readable zip ({e}): download it again') from None
  return sorted(last.values(), key=lambda m: m.offset)


__all__ = ['DEFLATED', 'IMAGE_EXTENSIONS', 'LAYOUTS', 'NOTE_KINDS', 'SINGLE_FILE', 'STORED',
           'Unit', 'ZipMember', 'empty_notes', 'fingerprint', 'inside', 'is_image', 'list_units',
           'tar_members', 'under', 'walk', 'zip_members']
