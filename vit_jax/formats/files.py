"""Reading and atomically writing checkpoint files, local or remote (gs:// etc.: vit_jax/fileio.py).

Shared by the .npz and .safetensors formats. Every problem a user can fix raises `UserError`.
"""

import contextlib
import os
import tempfile
import time
import uuid
from typing import BinaryIO, Callable

from vit_jax.errors import UserError
from vit_jax.fileio import gfile, is_remote

FIX = 'check the path, or re-download / re-export the checkpoint'


def describe(e: BaseException) -> str:
  """'ExceptionType: first 160 characters of the message', on one line."""
  text = ' '.join(str(e).split())[:160]
  return f'{type(e).__name__}: {text}' if text else type(e).__name__


def open_for_read(path: str, kind: str = '.npz'):
  """A binary file object for `path`; UserError if it is missing, a directory or unreadable."""
  if is_remote(path):
    gf = gfile()
    try:
      exists, isdir = gf.exists(path), gf.isdir(path)
    except Exception as e:  # pylint: disable=broad-except  (permission, network, unknown scheme)
      raise UserError(f'cannot open checkpoint {path}: {describe(e)}') from None
    if not exists:
      raise UserError(f'checkpoint {path} does not exist: {FIX}')
    if isdir:
      raise UserError(f'checkpoint {path} is a directory, not an {kind} file: give the file path')
    return gf.GFile(path, 'rb')
  if not os.path.exists(path):
    raise UserError(f'checkpoint {path} does not exist: {FIX}')
  if os.path.isdir(path):
    raise UserError(f'checkpoint {path} is a directory, not an {kind} file: give the file path')
  try:
    return open(path, 'rb')
  except OSError as e:
    raise UserError(f'cannot open checkpoint {path}: {e.strerror or e}') from None


def _temp_prefix(path: str) -> str:
  return f'.{os.path.basename(path)}.'


def remove_stale_temps(path: str, idle_s: float) -> None:
  """Removes the temporary files `atomic_write` left next to local `path` when its process was
  killed (SIGKILL: no cleanup runs), those untouched for `idle_s` seconds: a live writer of the
  same file (another process) touches its own more often."""
  directory = os.path.dirname(os.path.abspath(path))
  prefix, now = _temp_prefix(path), time.time()
  try:
    names = os.listdir(directory)
  except OSError:
    return
  for name in names:
    if name.startswith(prefix) and name.endswith('.tmp'):
      with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
        if now - os.stat(os.path.join(directory, name)).st_mtime > idle_s:
          os.remove(os.path.join(directory, name))


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
  """Calls `write(f)` on a temporary file and renames it to `path`: readers see the old file or
  the complete new one, never a partial one. Local files are fsynced (file and directory)."""
  if is_remote(path):
    _atomic_write_remote(path, write)
    return
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    existing = directory
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
      existing = os.path.dirname(existing)
    if not os.path.isdir(existing):  # a part of the path is a file
      raise UserError(f'cannot save {path}: {existing} is a file, not a directory: pass a path '
                      f'under a directory')
    raise UserError(f'cannot save {path}: directory {directory} does not exist; create it first')
  # A hidden temp file in the same directory (same filesystem: the rename is atomic).
  tmp = os.path.join(directory, f'{_temp_prefix(path)}{uuid.uuid4().hex}.tmp')
  try:
    with open(tmp, 'xb') as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  if hasattr(os, 'O_DIRECTORY'):  # make the rename itself durable
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
      os.fsync(dir_fd)
    finally:
      os.close(dir_fd)


def _atomic_write_remote(path: str, write: Callable[[BinaryIO], None]) -> None:
  """gs:// etc.: writers may need a seekable file, so write locally, upload to a temp name,
  rename."""
  gf = gfile()
  remote_tmp = f'{path}.tmp-{uuid.uuid4().hex}'
  with tempfile.TemporaryDirectory() as local_dir:
    local = os.path.join(local_dir, 'file')
    with open(local, 'wb') as f:
      write(f)
    try:
      gf.copy(local, remote_tmp, overwrite=True)
      gf.rename(remote_tmp, path, overwrite=True)
    except BaseException:
      with contextlib.suppress(Exception):
        gf.remove(remote_tmp)
      raise
