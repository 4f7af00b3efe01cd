"""A training run's workdir: checked, then created, before anything is trained.

What a run writes there, and the kind each name must be if it already exists:
  checkpoints/  tensorboard/  (directories)   metrics.jsonl  learning_curve.png  run.lock  (files)
A name of the wrong kind (a `checkpoints` file, a `metrics.jsonl` or `run.lock` directory) is a
UserError at start-up, not a failed write after some steps of training. `check` reads only (a
run refused at start-up leaves no empty workdir behind); `prepare` creates the workdir.
"""

import os

from vit_jax import fileio
from vit_jax.errors import UserError

DIRECTORIES = ('checkpoints', 'tensorboard')
FILES = ('metrics.jsonl', 'learning_curve.png', 'run.lock')


def prepare(workdir: str) -> None:
  """Creates the workdir (local or gs://) and checks its layout; UserError saying what to fix.
  A local workdir is checked without TensorFlow."""
  files = fileio.files_for(workdir)
  try:
    files.makedirs(workdir)
  except fileio.errors_for(workdir) as e:
    raise UserError(f'cannot create --workdir={workdir} ({fileio.error_reason(e)}): pass a '
                    f'writable directory') from None
  check(workdir)


def remove_if_empty(workdir: str) -> None:
  """Removes a local workdir that holds nothing (a run refused once it had created it)."""
  if not fileio.is_remote(workdir):
    try:
      os.rmdir(workdir)
    except OSError:  # not empty, or gone
      pass


def exists(workdir: str) -> bool:
  return fileio.files_for(workdir).exists(workdir)


def check(workdir: str) -> None:
  """Checks an existing workdir's layout (nothing to check, and nothing created, when it does not
  exist yet); UserError saying what to fix."""
  files = fileio.files_for(workdir)
  if files.exists(workdir) and not files.isdir(workdir):
    raise UserError(f'--workdir={workdir} is a file: pass a directory')
  for names, want_dir, kind in ((DIRECTORIES, True, 'a directory'), (FILES, False, 'a file')):
    for name in names:
      path = f'{workdir.rstrip("/")}/{name}'
      if files.exists(path) and files.isdir(path) != want_dir:
        raise UserError(f'{path} is not {kind}, and the run writes its {name} there: move it '
                        f'away or use another --workdir')


__all__ = ['check', 'exists', 'prepare', 'remove_if_empty', 'DIRECTORIES', 'FILES']
