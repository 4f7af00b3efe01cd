"""Image files (PNG/JPEG; local or gs://) -> model inputs, preprocessed like eval images.

`load_one(path, spec, decode_channels)` reads a file, decodes it to `decode_channels` (1 or 3) and
applies `preprocess.eval_preprocess(image, spec)`, the op the eval pipeline runs on dataset
records. A missing, unreadable or undecodable file raises `UserError` naming it. A CMYK JPEG
(which libjpeg decodes to RGB only) is converted to gray like RGB images for a 1-channel model.
Local file names need not be valid UTF-8 (`shown` gives them as text, with backslash escapes).
"""

import os
from typing import Sequence, Tuple

import numpy as np

from vit_jax import quiet
from vit_jax.data import ops
from vit_jax.errors import UserError
from vit_jax.fileio import is_remote


def shown(path: str) -> str:
  """A file name as text: bytes that are not valid UTF-8 (kept by Python as surrogates) are
  shown as backslash escapes."""
  return os.fsencode(path).decode('utf-8', 'backslashreplace')


def _open_local(path: str):
  """A local image file opened for reading, under its real name whatever its encoding;
  UserError if it is missing or unreadable."""
  try:
    return open(path, 'rb')
  except FileNotFoundError:
    raise UserError(f'cannot read image {shown(path)}: no such file; pass PNG or JPEG '
                    'files') from None
  except OSError as e:  # a directory, a symbolic-link loop, no permission, ...
    raise UserError(f'cannot read image {shown(path)}: {e.strerror or first_line(e)}; pass PNG '
                    'or JPEG files') from None


def read_bytes(path: str) -> bytes:
  """The bytes of an image file; UserError if it is missing or unreadable."""
  if not is_remote(path):
    with _open_local(path) as f:
      return f.read()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.exists(path):
    raise UserError(f'cannot read image {path}: no such file; pass PNG or JPEG files')
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()
  except (tf.errors.OpError, OSError) as e:
    raise UserError(f'cannot read image {path}: {first_line(e)}; pass PNG or JPEG files') \
        from None


def decode(encoded: bytes, channels: int):
  """uint8 [H, W, channels] (`preprocess.decode`); a CMYK JPEG for 1 channel is decoded to RGB
  and converted to gray (libjpeg converts CMYK to RGB only)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  data = tf.constant(encoded)
  try:
    return preprocess.decode(data, channels)
  except tf.errors.InvalidArgumentError:
    if channels != 1 or not bool(tf.io.is_jpeg(data)):
      raise
    return ops.to_channels(preprocess.decode(data, 3), 1)


# The first bytes by which tf.io.decode_image tells its formats apart (JPEG, PNG, GIF, BMP): a file
# that starts otherwise is one it cannot decode, said without importing TensorFlow.
_DECODABLE_STARTS = (b'\xff\xd8\xff', b'\x89PN', b'GIF', b'BM')


def load_one(path: str, spec, decode_channels: int) -> np.ndarray:
  """[S, S, C] float32 in [-1, 1] (`spec`: a `specs.eval_spec`); UserError naming the file."""
  encoded = read_bytes(path)
  if not encoded.startswith(_DECODABLE_STARTS):
    raise _undecodable(path)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  preprocess.hide_accelerators_from_tf()
  try:
    with quiet.silenced_stderr():  # libjpeg's own complaint; the UserError says it in one line
      image = decode(encoded, decode_channels)
    return preprocess.eval_preprocess(image, spec).numpy().astype(np.float32)
  except (tf.errors.InvalidArgumentError, ValueError):
    raise _undecodable(path) from None


def check_openable(path: str) -> None:
  """`read_bytes`' UserError for a local file that cannot be opened (nothing is read): said
  before a command loads its model."""
  if not is_remote(path):
    _open_local(path).close()


def check_all_openable(paths: Sequence[str]) -> None:
  """`unusable`'s UserError for the files of `paths` that `check_openable` refuses."""
  bad = []
  for path in paths:
    try:
      check_openable(path)
    except UserError as e:
      bad.append((shown(path), str(e)))
  if bad:
    raise unusable(bad)


def unusable(bad: Sequence[Tuple[str, str]]) -> UserError:
  """One line for the files that cannot be used ([(shown name, its error)]): the first file's
  error and the names of the others; nothing of the batch is printed."""
  others = ', '.join(p for p, _ in bad[1:4]) + (', ...' if len(bad) > 4 else '')
  more = f' (and {len(bad) - 1} more: {others})' if len(bad) > 1 else ''
  return UserError(f'{bad[0][1]}{more}; nothing was printed: remove or fix these files')


def _undecodable(path: str) -> UserError:
  return UserError(f'cannot decode image {shown(path)}: not a readable PNG or JPEG file')


def load(paths: Sequence[str], spec, decode_channels: int) -> np.ndarray:
  """[len(paths), S, S, C] float32 in [-1, 1]; the first unusable file raises UserError."""
  return np.stack([load_one(path, spec, decode_channels) for path in paths])


def first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return ' '.join(text[0].split()) if text else type(error).__name__
