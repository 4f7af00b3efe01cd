"""A checkpoint's own integrity, independent of the machine that reads it.

Each finished step directory gets `manifest.json`: every file under it with its size and CRC-32.
`damage(step_dir)` says what is wrong with a step's files (a file missing, another size, another
checksum, a metadata file that is not valid JSON), or None when nothing is: only such damage sets
a checkpoint aside. A restore that fails for any other reason (out of memory, a full disk,
permissions, an I/O error) leaves the checkpoint where it is. A step without a manifest (written
by an older version, or by a run killed between the rename and the manifest) is checked on its
orbax metadata files alone.
"""

import json
import os
import zlib
from typing import Dict, Optional

from etils import epath

MANIFEST = 'manifest.json'
_CHUNK = 1 << 22
# orbax's JSON metadata files (the step's, each item's, the PyTree's array index).
_METADATA_NAMES = ('_CHECKPOINT_METADATA', '_METADATA', 'metadata', '_sharding')


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
  out.pop(MANIFEST, None)
  return out


def _checksum(path: epath.Path) -> str:
  crc = 0
  with path.open('rb') as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return f'{crc:08x}'


def describe(step_dir) -> dict:
  """{relative path: [size, crc32]} of the files of a step directory (its manifest's content)."""
  step_dir = epath.Path(step_dir)
  return {rel: [path.stat().length, _checksum(path)]
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


def damage(step_dir) -> Optional[str]:
  """What is wrong with the files of a step directory, or None. OSError (permissions, I/O) is
  raised, not taken for damage: it says nothing about the files themselves."""
  step_dir = epath.Path(step_dir)
  manifest = step_dir / MANIFEST
  if manifest.exists():
    try:
      recorded = json.loads(manifest.read_text())['files']
    except (ValueError, KeyError, TypeError):
      return f'its {MANIFEST} is not valid'
    present = _files(step_dir)
    for rel, (size, crc) in sorted(recorded.items()):
      path = present.get(rel)
      if path is None:
        return f'{rel} is missing'
      actual = path.stat().length
      if actual != size:
        return f'{rel} has {actual} bytes, {size} were written'
      if _checksum(path) != crc:
        return f'{rel} does not match its checksum'
    return None
  for rel, path in sorted(_files(step_dir).items()):
    if os.path.basename(rel) in _METADATA_NAMES or rel.endswith('.json'):
      try:
        json.loads(path.read_bytes() or b'')
      except ValueError:
        return f'{rel} is not valid JSON'
  return None


__all__ = ['MANIFEST', 'damage', 'describe', 'write_manifest']
