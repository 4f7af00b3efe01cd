"""Where indexes are stored, and their small JSON files written atomically.

Indexes are written under `index_base(data_dir)`: $VIT_JAX_INDEX_DIR, else
`<data_dir>/vit_jax_index`; those of `folder:` datasets under `folder_index_base`; one directory
per source (`index_dir`), and per content for a source indexed `deep`, whose indexes of earlier
contents are removed (`remove_earlier`).
"""

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from typing import Optional

from vit_jax import fileio

DIR_VAR = 'VIT_JAX_INDEX_DIR'  # where indexes are written, instead of <data_dir>/vit_jax_index


def index_base(data_dir: str) -> str:
  """Where indexes are written: $VIT_JAX_INDEX_DIR, else `<data_dir>/vit_jax_index`."""
  return os.path.expanduser(os.environ.get(DIR_VAR) or os.path.join(data_dir, 'vit_jax_index'))


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


def folder_index_base(data_dir: Optional[str]) -> str:
  """Where the indexes of `folder:` datasets are written: $VIT_JAX_INDEX_DIR, else
  `<data_dir>/vit_jax_index` when a data_dir is given, else the user's cache
  ($XDG_CACHE_HOME, else ~/.cache) `/vit_jax/index`: an index is rebuilt at will."""
  if os.environ.get(DIR_VAR) or data_dir:
    return index_base(data_dir or '')
  return fileio.user_cache('index')


def remove_earlier(root: str, layout: str, base: str, keep: str) -> None:
  """Removes the indexes of the source at `root` under `base` that are tagged (`index_dir`) by
  other contents than index directory `keep`: they can never be read again."""
  untagged = os.path.basename(index_dir(root, layout, base))
  with contextlib.suppress(OSError):
    for name in os.listdir(base):
      tag = name[len(untagged) + 1:]
      if (name.startswith(f'{untagged}-') and re.fullmatch(r'[0-9a-f]+', tag)
          and os.path.join(base, name) != keep):
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def index_dir(root: str, layout: str, base: str, tag: str = '') -> str:
  """The index's directory under `base`: named by the source's path (and `tag`), so that an
  index of a changed source is found (and refused), never a stale one silently skipped."""
  slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(root)))[:64] or 'root'
  digest = hashlib.sha256(f'{os.path.abspath(root)}\0{layout}'.encode(
      'utf-8', 'surrogateescape')).hexdigest()[:12]
  return os.path.join(base, f'{slug}-{digest}{f"-{tag}" if tag else ""}')


def write_file(path: str, data: bytes) -> None:
  """`data` written to a temporary file renamed to `path` (readers never see part of it)."""
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)


def write_json(path: str, value) -> None:
  write_file(path, json.dumps(value).encode())


def read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


__all__ = ['DIR_VAR', 'folder_index_base', 'index_base', 'index_dir', 'read_json',
           'remove_earlier', 'write_failure', 'write_file', 'write_json']
