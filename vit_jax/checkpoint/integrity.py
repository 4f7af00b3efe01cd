"""A checkpoint's own integrity, independent of the machine that reads it.

Each step directory gets `manifest.json` inside orbax's commit (vit_jax/checkpoint/train_ckpt.py):
every file under it with its size and CRC-32, written before the step gets its final name, so a
step is never complete without one. `damage(step_dir)` says what is wrong with a step's files (a
file missing, another size, another checksum, a metadata file that is not valid JSON, no manifest
at all), or None when nothing is: only such damage sets a checkpoint aside. A step without a
manifest (written by a version that wrote it after the commit, and stopped in between) cannot be
verified, so it is treated as damaged. The two files orbax writes in the commit itself, after the
manifest (`_CHECKPOINT_METADATA`'s commit time, `commit_success.txt`), are only checked to be
readable JSON and text. A restore that fails for any other reason (out of memory, a full disk,
permissions, an I/O error) leaves the checkpoint where it is.

Every restore is checked, not only a failed one, in two parts so that it costs little time:
`damage(step_dir, large=False)` before anything is read (every file's presence and size, the
checksums of the files up to `SMALL` bytes: metadata, config, facts), and a `Verification` of the
larger files' checksums on a thread while the arrays are read (a streaming CRC-32 in large chunks;
zlib releases the GIL, so it runs beside orbax's own reading).
"""

import json
import threading
import zlib
from typing import Dict, List, Optional, Tuple

from etils import epath

MANIFEST = 'manifest.json'
_CHUNK = 8 << 20
SMALL = 1 << 20  # files up to this size are checked before a restore, larger ones beside it
# orbax's JSON metadata files (the step's, each item's, the PyTree's array index).
_METADATA_NAMES = ('_CHECKPOINT_METADATA', '_METADATA', 'metadata', '_sharding')
# The step's own files that orbax's commit writes after the manifest: not in it.
_COMMITTED_AFTER = ('_CHECKPOINT_METADATA', 'commit_success.txt')
UNVERIFIED = f'it has no {MANIFEST}, so its files cannot be verified'


def _files(step_dir: epath.Path) -> Dict[str, epath.Path]:
  """{path relative to the step directory: path} of its files, the manifest left out."""
  out = {}
  pending = ['']
  while pending:  # (epath's rglob refuses `**` on every path, walk() is local-only)
    rel = pending.pop()
    for child in (step_dir / rel if rel else step_dir).iterdir():
      name = f'{rel}/{child.name}' if rel else child.name
      if child.is_dir():
        pending.append(name)
      elif not child.name.startswith(f'.{MANIFEST}'):
        out[name] = child
  for name in (MANIFEST, *_COMMITTED_AFTER):
    out.pop(name, None)
  return out


class _Stopped(Exception):
  """A Verification cancelled while it read."""


def _checksum(path: epath.Path, buffer: Optional[bytearray] = None,
              stop: Optional[threading.Event] = None) -> str:
  """The CRC-32 of a file, read in chunks into `buffer` (one allocation for all the files)."""
  buffer = buffer if buffer is not None else bytearray(_CHUNK)
  view = memoryview(buffer)
  crc = 0
  with path.open('rb') as f:
    readinto = getattr(f, 'readinto', None)
    while True:
      if stop is not None and stop.is_set():
        raise _Stopped()
      if readinto is not None:
        count = readinto(view)
        chunk = view[:count]
      else:  # a remote file without readinto
        chunk = f.read(_CHUNK)
        count = len(chunk)
      if not count:
        break
      crc = zlib.crc32(chunk, crc)
  return f'{crc:08x}'


def describe(step_dir) -> dict:
  """{relative path: [size, crc32]} of the files of a step directory (its manifest's content)."""
  step_dir = epath.Path(step_dir)
  buffer = bytearray(_CHUNK)
  return {rel: [path.stat().length, _checksum(path, buffer)]
          for rel, path in sorted(_files(step_dir).items())}


def write_manifest(step_dir) -> None:
  """Writes `manifest.json` into a finished step directory (atomically: a temporary file renamed)."""
  step_dir = epath.Path(step_dir)
  if (step_dir / MANIFEST).exists():
    return
  text = json.dumps({'format': 'vit_jax.manifest', 'version': 1, 'files': describe(step_dir)})
  tmp = step_dir / f'.{MANIFEST}.tmp'
  tmp.write_text(text)
  tmp.rename(step_dir / MANIFEST)


class _Invalid(Exception):
  pass


def _recorded(step_dir: epath.Path) -> Optional[Dict[str, Tuple[int, str]]]:
  """The manifest's {relative path: (size, crc)}, None without a manifest; _Invalid if it is not
  a manifest."""
  manifest = step_dir / MANIFEST
  if not manifest.exists():
    return None
  try:
    files = json.loads(manifest.read_text())['files']
    return {str(rel): (int(size), str(crc)) for rel, (size, crc) in files.items()}
  except (ValueError, KeyError, TypeError, AttributeError):
    raise _Invalid() from None


def damage(step_dir, *, large: bool = True) -> Optional[str]:
  """What is wrong with the files of a step directory, or None. OSError (permissions, I/O) is
  raised, not taken for damage: it says nothing about the files themselves. `large=False` leaves
  out the checksums of the files above SMALL bytes (a `Verification` computes them)."""
  step_dir = epath.Path(step_dir)
  try:
    recorded = _recorded(step_dir)
  except _Invalid:
    return f'its {MANIFEST} is not valid'
  if recorded is None:
    return UNVERIFIED
  commit = step_dir / _COMMITTED_AFTER[0]
  if commit.exists():
    try:
      json.loads(commit.read_bytes() or b'')
    except ValueError:
      return f'{_COMMITTED_AFTER[0]} is not valid JSON'
  present = _files(step_dir)
  buffer = None
  for rel, (size, crc) in sorted(recorded.items()):
    path = present.get(rel)
    if path is None:
      return f'{rel} is missing'
    actual = path.stat().length
    if actual != size:
      return f'{rel} has {actual} bytes, {size} were written'
    if large or size <= SMALL:
      buffer = buffer if buffer is not None else bytearray(_CHUNK if large else SMALL)
      if _checksum(path, buffer) != crc:
        return _mismatch(rel)
  return None


def _mismatch(rel: str) -> str:
  return f'{rel} does not match its checksum'


class Verification:
  """The checksums of a step's files above SMALL bytes, computed on a thread from construction
  (a step without a manifest has none to compute). `result()` waits for them: the damage found,
  or None; what reading raised (OSError, MemoryError) is raised there. `cancel()` stops it."""

  def __init__(self, step_dir):
    step_dir = epath.Path(step_dir)
    try:
      recorded = _recorded(step_dir) or {}
    except _Invalid:  # `damage` says so before a Verification is made
      recorded = {}
    self._todo: List[Tuple[str, epath.Path, str]] = [
        (rel, step_dir / rel, crc) for rel, (size, crc) in sorted(recorded.items())
        if size > SMALL]
    self._stop = threading.Event()
    self._found: Optional[str] = None
    self._error: Optional[BaseException] = None
    self._thread = None
    if self._todo:
      buffer = bytearray(_CHUNK)  # allocated here, by the caller, before the restore starts
      self._thread = threading.Thread(target=self._run, args=(buffer,), daemon=True,
                                      name='checkpoint-verification')
      self._thread.start()

  def _run(self, buffer: bytearray) -> None:
    try:
      for rel, path, crc in self._todo:
        if _checksum(path, buffer, self._stop) != crc:
          self._found = _mismatch(rel)
          return
    except _Stopped:
      pass
    except BaseException as e:  # pylint: disable=broad-except  # handed to result()
      self._error = e

  def result(self) -> Optional[str]:
    if self._thread is not None:
      self._thread.join()
    if self._error is not None:
      raise self._error
    return self._found

  def cancel(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()


__all__ = ['MANIFEST', 'SMALL', 'UNVERIFIED', 'Verification', 'damage', 'describe', 'write_manifest']
