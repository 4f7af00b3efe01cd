"""Local or remote paths (gs:// and the like): the one rule telling them apart, and the file
calls for each (tf.io.gfile for remote paths only, so local file work never imports TensorFlow);
and the user's cache directory (`user_cache`), where rebuildable files are kept."""

import os
import re

_REMOTE = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


def is_remote(path: str) -> bool:
  return bool(_REMOTE.match(path))


def user_cache(*parts: str, environ=None) -> str:
  """A path under the user's cache for vit_jax: $XDG_CACHE_HOME/vit_jax/..., else
  ~/.cache/vit_jax/... (what is kept there can be rebuilt)."""
  env = os.environ if environ is None else environ
  base = env.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'vit_jax', *parts)


def gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (only for gs:// and the like)
  return tf.io.gfile


class _LocalFiles:
  """The tf.io.gfile calls made through `files_for`, for local paths, without TensorFlow."""
  GFile = staticmethod(open)
  exists = staticmethod(os.path.exists)

  isdir = staticmethod(os.path.isdir)

  @staticmethod
  def makedirs(path: str) -> None:
    os.makedirs(path, exist_ok=True)

  @staticmethod
  def rename(src: str, dst: str, overwrite: bool = False) -> None:
    if not overwrite and os.path.exists(dst):
      raise FileExistsError(f'{dst} exists')
    os.replace(src, dst)


def files_for(path: str):
  """tf.io.gfile for a remote path (gs://, ...), its local stand-in otherwise: code that only
  touches files never imports TensorFlow (seconds of start-up) for a local workdir."""
  return gfile() if is_remote(path) else _LocalFiles


def errors_for(path: str) -> tuple:
  """What a failed call of `files_for(path)` raises: OSError, and for a remote path TensorFlow's
  OpError too (local paths still import no TensorFlow)."""
  if not is_remote(path):
    return (OSError,)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (already loaded by gfile())
  return (OSError, tf.errors.OpError)


def error_reason(error: Exception) -> str:
  """The one-line reason of a failed file call: an OSError's strerror, TensorFlow's message
  without its '<path>; ' prefix, else the error's text (its type name if empty)."""
  reason = (getattr(error, 'strerror', None) or getattr(error, 'message', None) or
            str(error)).strip()
  return reason.splitlines()[0].rsplit('; ', 1)[-1] if reason else type(error).__name__


__all__ = ['error_reason', 'errors_for', 'files_for', 'gfile', 'is_remote', 'user_cache']
