"""The one exception type for user mistakes, and the one line for a failure of the machine.

Anything a user can get wrong (a variant name, a config key, a dataset that is not prepared, a batch
size that does not split over the devices) raises `UserError` with a message that says what is wrong
and how to fix it. The CLIs catch it and print that one line; internal bugs keep their traceback.
A failure that comes from the machine rather than the program (a full disk, a missing permission,
a path too long for its file system or under a regular file, too little memory) is one line too:
`environment_failure` words it, naming the file or the failure and the fix.
"""

import errno
import os
import re
from typing import Iterator, Optional


class UserError(ValueError):
  """A mistake in what the user asked for; the message says how to fix it."""


# The flags of the running command (`cli.run_main` fills it in). A message that names a setting
# spells it with `setting`: the command's own flag where it has one (`--data_dir` of evaluate),
# else the trainer's config key (`--config.data_dir`).
COMMAND_FLAGS = set()


def setting(name: str) -> str:
  return f'--{name}' if name in COMMAND_FLAGS else f'--config.{name}'


def evals_option(entry: str, key: str) -> str:
  """Option `key` of evaluator entry `entry` as the running command sets it: evaluate's
  `--option=ENTRY.KEY`, else the trainer's `--config.evals.ENTRY.KEY`."""
  return f'--option={entry}.{key}' if 'option' in COMMAND_FLAGS else f'--config.evals.{entry}.{key}'


_FIXES = {
    errno.ENOSPC: 'free space there, then rerun the same command',
    errno.EDQUOT: 'free space (or raise the quota) there, then rerun the same command',
    errno.EACCES: 'fix its permissions or pass a writable location',
    errno.EPERM: 'fix its permissions or pass a writable location',
    errno.EROFS: 'pass a location on a writable file system',
    errno.ENAMETOOLONG: 'use shorter file or folder names (most file systems allow 255 bytes a '
                        'name)',
    errno.ENOTDIR: 'a part of the path is a file, not a directory: pass a path under a directory',
    errno.EISDIR: 'it is a directory: pass a file path, or move the directory away',
    errno.EIO: 'the disk or file system reported an I/O error: check it, then rerun the same '
               'command',
}
# The same failures as words in the text of errors that carry no errno (tensorstore, TensorFlow).
_WORDS = {
    'No space left on device': errno.ENOSPC, 'Disk quota exceeded': errno.EDQUOT,
    'Permission denied': errno.EACCES, 'Read-only file system': errno.EROFS,
    'File name too long': errno.ENAMETOOLONG, 'Not a directory': errno.ENOTDIR,
}


# Words of out-of-memory failures: XLA's and tensorstore's status, C++'s, Python's threads, and the
# dynamic loader's (a library that cannot be mapped under an address-space limit, `ulimit -v`).
OUT_OF_MEMORY_WORDS = ('RESOURCE_EXHAUSTED', 'Out of memory', 'out of memory', 'bad_alloc',
                       'Cannot allocate memory', "can't start new thread", 'MemoryError',
                       'failed to map segment from shared object')
MEMORY_FIX = 'free memory (or raise the memory limit: ulimit -v)'


def out_of_memory(error: BaseException) -> Optional[str]:
  """'Type: text' of the error in `error`'s chain that says memory ran out, or None."""
  for e in chain(error):
    text = ' '.join(str(e).split())[:200]
    if isinstance(e, MemoryError) or any(w in f'{type(e).__name__}: {text}'
                                         for w in OUT_OF_MEMORY_WORDS):
      return f'{type(e).__name__}: {text}' if text else type(e).__name__
  return None


_PATH = re.compile(r'(?<![\w.])(/[^\s;:,\'"()]+)')


def chain(error: BaseException) -> Iterator[BaseException]:
  """The error and the ones it was raised from or during, outermost first."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def environment_errno(error: BaseException) -> Optional[int]:
  """The errno of a failure of the machine behind `error` (one of `_FIXES`), or None."""
  for e in chain(error):
    if isinstance(e, OSError) and e.errno in _FIXES:
      return e.errno
  for e in chain(error):
    text = str(e)
    for word, code in _WORDS.items():
      if word in text:
        return code
  return None


def missing_module(error: BaseException) -> Optional[str]:
  """The top-level name of a module outside the project that `error` failed to import (a
  dependency not installed), or None."""
  name = getattr(error, 'name', None) if isinstance(error, ModuleNotFoundError) else None
  top = (name or '').split('.')[0]
  return top if top and top != 'vit_jax' else None


def environment_failure(error: BaseException) -> Optional[str]:
  """One line for a failure of the machine ("cannot write X (No space left on device): free
  space there, ..."), or a dependency that is not installed, or None for any other error (a bug
  keeps its traceback)."""
  module = missing_module(error)
  if module:
    return (f'this command needs the Python module {module!r}, which is not installed: install '
            f'the project\'s dependencies (make install, or pip install -r requirements.lock), '
            f'then rerun the same command')
  code = environment_errno(error)
  if code is None:
    memory = out_of_memory(error)
    return f'out of memory ({memory}): {MEMORY_FIX}, then rerun the same command' if memory \
        else None
  filename = next((e.filename for e in chain(error)
                   if isinstance(e, OSError) and e.filename), None)
  if not filename:  # TensorFlow and tensorstore put the path in their text
    found = (_PATH.search(str(e)) for e in chain(error))
    filename = next((m.group(1) for m in found if m), None)
  if filename:  # an atomic write's hidden temporary file (formats/files.py): name its target
    filename = re.sub(r'/\.([^/]+)\.[0-9a-f]{32}\.tmp$', r'/\1', str(filename))
  where = f' {filename}' if filename else ''
  verb = 'write' if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else 'use'
  return f'cannot {verb}{where} ({os.strerror(code)}): {_FIXES[code]}'


__all__ = ['MEMORY_FIX', 'OUT_OF_MEMORY_WORDS', 'UserError', 'chain', 'environment_errno',
           'environment_failure', 'missing_module', 'out_of_memory']
