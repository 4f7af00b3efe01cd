"""One unit of a source -> one part file of its index (run in the indexing processes).

A part holds, for each image of the unit, its name ('<unit>/<member>'), the file of the source
that holds its bytes and their byte range (a member of a tar inside the outer tar is addressed by
the outer offset plus the inner one; for the folder layouts, its own file and its modification
time), the unit's notes, the folders inside a folder unit (with their modification times, so that
an image added to a nested folder is seen), and a digest of every image's name, size and the
CRC-32 of all its bytes: one extra pass over the bytes, so that an image changed in place (the
same size, the same last bytes) is other data. A zip member's bytes are those stored in the zip
(deflated or not), with its method and the CRC-32 the zip records of its data, which that pass
checks (inflating a deflated member): a damaged member is refused here, in one line. A part is written atomically: a killed indexer
leaves no half-written part.
"""

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import zlib
from typing import Optional, Tuple

import numpy as np

from vit_jax.data.archive.layouts import (DEFLATED, ZipMember, empty_notes, inside, is_image,
                                          tar_members, under, walk, zip_members)
from vit_jax.data.archive.store import write_failure
from vit_jax.errors import UserError

CHECKSUM = 'crc32'  # of every byte of each image, in the content digest (identity.py records it)
_CHUNK = 1 << 22  # bytes read at a time for the checksum


def crc32(fd: int, offset: int, size: int) -> int:
  """The CRC-32 of bytes [offset, offset + size) of open file `fd`; OSError if fewer are there."""
  crc, done = 0, 0
  while done < size:
    data = os.pread(fd, min(_CHUNK, size - done), offset + done)
    if not data:
      raise OSError(errno.EIO, f'{size - done} bytes missing at byte {offset + done}')
    crc, done = zlib.crc32(data, crc), done + len(data)
  return crc


def damaged(path: str, name: str) -> str:
  """The line for a zip member whose data is not what the zip's CRC-32 says."""
  return (f'{path}: its member {name} is damaged (its data does not match the CRC-32 the zip '
          f'records): download the zip again, then rerun')


def zip_crc(fd: int, path: str, member: ZipMember) -> int:
  """The CRC-32 of a zip member's stored bytes (open file `fd`), its data checked against the
  zip's CRC-32 of it (inflated first when deflated); UserError naming it when damaged."""
  inflate = zlib.decompressobj(-15) if member.method == DEFLATED else None
  crc, data_crc, done = 0, 0, 0
  try:
    while done < member.size:
      data = os.pread(fd, min(_CHUNK, member.size - done), member.offset + done)
      if not data:
        raise OSError(errno.EIO, f'{member.size - done} bytes missing at byte '
                                 f'{member.offset + done}')
      crc, done = zlib.crc32(data, crc), done + len(data)
      data_crc = zlib.crc32(inflate.decompress(data) if inflate else data, data_crc)
    if inflate and not inflate.eof:
      raise zlib.error('the deflate stream does not end')
  except zlib.error:
    raise UserError(damaged(path, member.name)) from None
  if data_crc != member.crc:
    raise UserError(damaged(path, member.name))
  return crc


def index_unit(task) -> Tuple[int, Optional[str]]:
  """Indexes unit `k` into its part file; (k, error message or None)."""
  root, layout, k, unit, file_id, part = task
  try:
    names, file_ids, offsets, sizes, mtimes, crcs, links = [], [], [], [], [], [], []
    folders, methods, data_crcs = [], [], []  # per image: how a zip stores it (0: as it is)
    if layout in ('folders', 'flat_folder'):
      files, notes, walked = walk(root, unit)
      folders = [[rel, st.st_mtime_ns] for rel, st in walked]
      real_root = os.path.realpath(root)
      for rel, st in files:
        fd = os.open(under(root, rel), os.O_RDONLY)
        try:
          crcs.append(crc32(fd, 0, st.st_size))
        finally:
          os.close(fd)
        names.append(rel)
        file_ids.append(-1)
        offsets.append(0)
        sizes.append(st.st_size)
        mtimes.append(st.st_mtime_ns)
        methods.append(0)
        data_crcs.append(0)
        if os.path.islink(under(root, rel)) or st.st_nlink > 1:
          real = os.path.realpath(under(root, rel))
          home = (os.path.relpath(real, real_root) if inside(real, real_root) else None)
          links.append([rel, st.st_ino, st.st_size, home])
    elif layout == 'flat_zip':
      path = under(root, unit.file)
      notes = empty_notes()
      fd = os.open(path, os.O_RDONLY)
      try:
        for m in zip_members(path, notes):
          if not is_image(m.name):
            notes['non_image'].append(m.name)
            continue
          names.append(m.name)
          file_ids.append(file_id)
          offsets.append(m.offset)
          sizes.append(m.size)
          mtimes.append(0)
          crcs.append(zip_crc(fd, path, m))
          methods.append(m.method)
          data_crcs.append(m.crc)
      finally:
        os.close(fd)
    else:
      path = under(root, unit.file)
      shown = f'{path}:{unit.name}.tar' if layout == 'tar_of_tars' else path
      notes = empty_notes()
      members = tar_members(path, unit.size, unit.offset, shown, notes)
      fd = os.open(path, os.O_RDONLY)
      try:
        for m in members:
          name = f'{unit.name}/{m.name}' if unit.name else m.name
          if not is_image(m.name):
            notes['non_image'].append(name)
            continue
          names.append(name)
          file_ids.append(file_id)
          offsets.append(unit.offset + m.offset_data)
          sizes.append(m.size)
          mtimes.append(0)  # a member is checked by its archive's size and time
          crcs.append(crc32(fd, unit.offset + m.offset_data, m.size))
          methods.append(0)
          data_crcs.append(0)
      finally:
        os.close(fd)
      notes = {kind: [n if kind == 'non_image' or not unit.name else f'{unit.name}/{n}'
                      for n in names_] for kind, names_ in notes.items()}
  except UserError as e:
    return k, str(e)
  except OSError as e:
    return k, f'cannot read {under(root, unit.file)} ({e.strerror or e}): check it, then rerun'
  order = sorted(range(len(names)), key=names.__getitem__)
  encoded = [names[i].encode('utf-8', 'surrogateescape') for i in order]
  digest = hashlib.sha256()
  for i, name in zip(order, encoded):
    digest.update(name + b'\0' + np.int64(sizes[i]).tobytes() + np.uint32(crcs[i]).tobytes())
  tmp = f'{part}.{os.getpid()}.tmp.npz'
  try:
    np.savez(tmp, file_id=np.asarray([file_ids[i] for i in order], np.int32).reshape(-1),
             offset=np.asarray([offsets[i] for i in order], np.int64).reshape(-1),
             size=np.asarray([sizes[i] for i in order], np.int64).reshape(-1),
             mtime=np.asarray([mtimes[i] for i in order], np.int64).reshape(-1),
             method=np.asarray([methods[i] for i in order], np.int8).reshape(-1),
             data_crc=np.asarray([data_crcs[i] for i in order], np.uint32).reshape(-1),
             names=np.frombuffer(b''.join(encoded), np.uint8),
             name_lengths=np.asarray([len(e) for e in encoded], np.int64).reshape(-1),
             unit=np.asarray(json.dumps(dataclasses.astuple(unit))),
             notes=np.asarray(json.dumps(notes)), links=np.asarray(json.dumps(links)),
             folders=np.asarray(json.dumps(folders)),
             digest=np.asarray(digest.hexdigest()))
    os.replace(tmp, part)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    return k, write_failure(e, os.path.dirname(os.path.dirname(part)))
  return k, None


__all__ = ['CHECKSUM', 'crc32', 'damaged', 'index_unit', 'zip_crc']
