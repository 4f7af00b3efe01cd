"""TensorFlow imported quietly, and only where a command needs it.

TensorFlow prints its CPU-feature and oneDNN banners through absl's C++ logging before that is
initialised, which ignores TF_CPP_MIN_LOG_LEVEL; a command's user error must stay one line on
stderr. `quiet_when_needed` makes the first `import tensorflow`, wherever it happens, go through
`import_quietly`, so a command that never reads a tf.data pipeline never imports it.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

from vit_jax import quiet


def import_quietly() -> None:
  """Imports TensorFlow with file descriptor 2 pointed at /dev/null. An import failure still
  raises (with its traceback) once stderr is restored."""
  if 'tensorflow' in sys.modules:
    return
  with quiet.silenced_stderr():
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  # heavy, optional


class _QuietImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """The finder `quiet_when_needed` installs. Only an import imports TensorFlow: asking whether it
  is installed (`importlib.util.find_spec`, as etils' paths do for every local path) does not."""

  def find_spec(self, name, path, target=None):
    del target
    if name != 'tensorflow' or importlib.machinery.PathFinder.find_spec(name, path) is None:
      return None
    return importlib.util.spec_from_loader(name, self)

  def create_module(self, spec):
    if self in sys.meta_path:
      sys.meta_path.remove(self)
    import_quietly()
    return sys.modules[spec.name]

  def exec_module(self, module):
    del module


def quiet_when_needed() -> None:
  """Makes the process's first `import tensorflow` go through `import_quietly`."""
  if 'tensorflow' not in sys.modules and not any(
      isinstance(f, _QuietImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietImport())


__all__ = ['import_quietly', 'quiet_when_needed']
