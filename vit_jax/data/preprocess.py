"""The preprocessing every input pipeline runs on one image, in TensorFlow (eagerly or in
`tf.data.map` alike): decode -> the spec's ops (vit_jax/data/ops.py) -> [-1, 1].

All train randomness is stateless: `example_seed(seed, stream, position)` derives an example's
seed (a [2] int64 tensor) from the run seed, the process index and the example's position in the
stream, and each random op draws from its own slot of it (`ops.op_seed`), so a pipeline is exactly
reproducible and resumable.
"""

from typing import Optional

import tensorflow as tf

from vit_jax.data import ops
from vit_jax.data.specs import Spec


def hide_accelerators_from_tf() -> None:
  """Makes TF use the CPU only, so it never takes GPU memory from JAX (no-op if too late)."""
  try:
    tf.config.set_visible_devices([], 'GPU')
  except (RuntimeError, ValueError):  # Devices already initialised, or no such device type.
    pass


def example_seed(seed, stream, position) -> tf.Tensor:
  """The stateless [2] int64 seed of the example at `position` of `stream` (e.g. the process)."""
  key = tf.stack([tf.cast(seed, tf.int64), tf.cast(stream, tf.int64)])
  return tf.random.experimental.stateless_fold_in(key, tf.cast(position, tf.int64))


def decode(stored: tf.Tensor, channels: int) -> tf.Tensor:
  """A stored image as uint8 [H, W, channels]: PNG/JPEG/GIF/BMP bytes decoded, or uint8 pixels
  (an array read in place) as they are."""
  if stored.dtype != tf.string:
    return stored
  image = tf.io.decode_image(stored, channels=channels, expand_animations=False)
  image.set_shape([None, None, channels])
  return image


def train_preprocess(image: tf.Tensor, seed: tf.Tensor, spec: Spec,
                     channels: Optional[int] = None) -> tf.Tensor:
  """uint8 [H, W, C] image + its [2] seed -> float32 [S, S, C'] in [-1, 1] (S = image_size);
  `channels`: C' (default: what the spec's ops give from C)."""
  return ops.apply(spec.ops, image, seed, channels or spec.channels or image.shape[-1])


def eval_preprocess(image: tf.Tensor, spec: Spec, channels: Optional[int] = None) -> tf.Tensor:
  """uint8 [H, W, C] image -> float32 [S, S, C'] in [-1, 1], deterministic."""
  return ops.apply(spec.ops, image, None, channels or spec.channels or image.shape[-1])


def decode_channels(stored_shape) -> int:
  """Channels to decode a stored image feature to: 1 for grayscale, else 3 (alpha dropped)."""
  return 1 if stored_shape and stored_shape[-1] == 1 else 3


def output_channels(stored_shape, channels: Optional[int]) -> int:
  """Channels of the preprocessed images."""
  return channels if channels is not None else decode_channels(stored_shape)
