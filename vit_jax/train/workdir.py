"""A training run's workdir: created, and its layout checked, before anything is trained.

What a run writes there, and the kind each name must be if it already exists:
  checkpoints/  tensorboard/  (directories)   metrics.jsonl  learning_curve.png  (files)
A name of the wrong kind (a `checkpoints` file, a `metrics.jsonl` directory) is a UserError at
start-up, not a failed write after some steps of training.
"""

import os

from vit_jax import fileio
from vit_jax.errors import UserError

DIRECTORIES = ('checkpoints', 'tensorboard')
FILES = ('metrics.jsonl', 'learning_curve.png')


def prepare(workdir: str) -> None:
  """Creates the workdir (local or gs://) and checks its layout; UserError saying what to fix.
  A local workdir is checked without TensorFlow (the trainer imports it later, while its programs
  compile)."""
  if fileio.is_remote(workdir):
    gfile = fileio.gfile()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (already loaded by gfile())
    makedirs, exists, isdir, errors = gfile.makedirs, gfile.exists, gfile.isdir, tf.errors.OpError
  else:
    makedirs = lambda path: os.makedirs(path, exist_ok=True)
    exists, isdir, errors = os.path.exists, os.path.isdir, OSError
  try:
    makedirs(workdir)
  except errors as e:
    reason = getattr(e, 'message', None) or getattr(e, 'strerror', None) or str(e)
    raise UserError(f'cannot create --workdir={workdir} ({reason.splitlines()[0]}): pass a '
                    f'writable directory') from None
  for names, want_dir, kind in ((DIRECTORIES, True, 'a directory'), (FILES, False, 'a file')):
    for name in names:
      path = f'{workdir.rstrip("/")}/{name}'
      if exists(path) and isdir(path) != want_dir:
        raise UserError(f'{path} is not {kind}, and the run writes its {name} there: move it '
                        f'away or use another --workdir')


__all__ = ['prepare', 'DIRECTORIES', 'FILES']
