"""Where a model source's files lie, checked without importing JAX, TensorFlow or orbax: the
commands that read a model (predict, export, convert) say a missing bundle, run or params file
before they load anything (`check`); the other mistakes of the source flags are said by
`bundle.resolve`, which reads it.
"""

import os
from typing import Optional

from vit_jax.checkpoint import steps
from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.formats import files

MODEL_FILE = 'model.json'  # in a bundle directory: its model spec, preprocessing and classes
PARAM_SUFFIXES = ('.npz', '.safetensors')


def bundle_model_file(path: str) -> str:
  """The model description of bundle directory `path`; UserError if it holds none."""
  model_file = os.path.join(path, MODEL_FILE)
  if not os.path.isfile(model_file):
    raise UserError(f'--bundle={path} is not a bundle (no {MODEL_FILE}): make one with python -m '
                    'vit_jax export --workdir=DIR --out=BUNDLE')
  return model_file


def check(*, workdir: Optional[str], checkpoint: Optional[str], bundle: Optional[str],
          params_options: bool = False) -> None:
  """UserError for a source that names one thing (a bundle, a run, a local params file) which is
  not there: the line `bundle.resolve` would say after loading JAX. `params_options`: --model or
  --model_options given, which only a params file takes (resolve says so first)."""
  checkpoint = None if checkpoint in (None, '') else str(checkpoint)
  if bundle:
    if not (workdir or checkpoint):
      bundle_model_file(os.fspath(bundle))
  elif checkpoint is not None and checkpoint.endswith(PARAM_SUFFIXES):
    if not workdir and not is_remote(checkpoint):
      files.open_for_read(checkpoint, os.path.splitext(checkpoint)[1]).close()
  elif (checkpoint is None or checkpoint.isdigit() or os.path.isdir(checkpoint)) and not (
      params_options or (workdir and is_remote(workdir))):
    steps.resolve_checkpoint(workdir, checkpoint)


__all__ = ['MODEL_FILE', 'PARAM_SUFFIXES', 'bundle_model_file', 'check']
