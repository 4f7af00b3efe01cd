"""Image preprocessing ops in TensorFlow: the same code runs eagerly and inside `tf.data.map`.

All train randomness is stateless: every random op takes an explicit seed (a [2] int64 tensor) that
`example_seed(seed, stream, position)` derives from the run seed, the process index and the
example's position in the stream, so a pipeline is exactly reproducible and resumable.

Pixel pipeline: decode (uint8) -> crop / resize (float32, values stay in [0, 255]) -> optional
flip -> optional RandAugment (`randaug.py`, on the image rounded to uint8) -> channel conversion
-> `value_range`: (x - 127.5) / 127.5 in [-1, 1].

Train crops (`TrainSpec.crop`):
  'inception'    stateless sample_distorted_bounding_box, area [0.05, 1], aspect [3/4, 4/3],
                 min_object_covered 0, whole image if no box fits; crop -> bilinear resize to
                 image_size (no antialias), as the original fine-tuning code.
  'resize_crop'  resize the shorter side to `resize`, then a random image_size crop.
  'pad_crop'     zero-pad `pad` pixels per side, random crop back to the input size (classic
                 small-image augmentation); then bilinear resize to image_size if that differs.
  'resize'       bilinear resize of the whole image to image_size x image_size.
Eval crops (`EvalSpec.crop`):
  'central'      resize the shorter side to `resize`, then the central image_size crop.
  'resize'       resize the whole image to image_size x image_size (aspect ratio not kept), as
                 the original fine-tuning code.
Resizing the shorter side uses bilinear with antialiasing (a proper filter when shrinking, plain
bilinear when enlarging); the two whole-image resizes use plain bilinear like the original.
"""

from typing import Optional

import tensorflow as tf

from vit_jax.data import randaug
from vit_jax.data.choices import EVAL_CROPS, TRAIN_CROPS
from vit_jax.data.specs import EvalSpec, TrainSpec
from vit_jax.errors import UserError

INCEPTION_AREA_RANGE = (0.05, 1.0)
INCEPTION_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def hide_accelerators_from_tf() -> None:
  """Makes TF use the CPU only, so it never takes GPU memory from JAX (no-op if too late)."""
  try:
    tf.config.set_visible_devices([], 'GPU')
  except (RuntimeError, ValueError):  # Devices already initialised, or no such device type.
    pass


# ---------------------------------------------------------------------------------------------
# Seeds.


def example_seed(seed, stream, position) -> tf.Tensor:
  """The stateless [2] int64 seed of the example at `position` of `stream` (e.g. the process)."""
  key = tf.stack([tf.cast(seed, tf.int64), tf.cast(stream, tf.int64)])
  return tf.random.experimental.stateless_fold_in(key, tf.cast(position, tf.int64))


# ---------------------------------------------------------------------------------------------
# Single ops. Images are [H, W, C]; crops keep the dtype, resizes return float32.


def decode(encoded: tf.Tensor, channels: int) -> tf.Tensor:
  """Decodes PNG/JPEG/GIF/BMP bytes to uint8 [H, W, channels]."""
  image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
  image.set_shape([None, None, channels])
  return image


def value_range(image: tf.Tensor) -> tf.Tensor:
  """Maps pixel values [0, 255] to [-1, 1] as (x - 127.5) / 127.5, float32."""
  return (tf.cast(image, tf.float32) - 127.5) / 127.5


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
  """Resizes the whole image to size x size (bilinear, no antialias, aspect ratio not kept)."""
  return tf.image.resize(image, [size, size], method='bilinear', antialias=False)


def resize_small(image: tf.Tensor, size: int) -> tf.Tensor:
  """Resizes so that the shorter side is `size`, keeping the aspect ratio (float32)."""
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  ratio = tf.cast(size, tf.float32) / tf.minimum(h, w)
  new_h = tf.maximum(tf.cast(tf.round(h * ratio), tf.int32), size)
  new_w = tf.maximum(tf.cast(tf.round(w * ratio), tf.int32), size)
  return tf.image.resize(image, tf.stack([new_h, new_w]), method='bilinear', antialias=True)


def central_crop(image: tf.Tensor, size: int) -> tf.Tensor:
  """The central size x size crop (the image must be at least that large)."""
  shape = tf.shape(image)
  top, left = (shape[0] - size) // 2, (shape[1] - size) // 2
  crop = tf.slice(image, tf.stack([top, left, 0]), tf.stack([size, size, -1]))
  crop.set_shape([size, size, image.shape[-1]])
  return crop


def random_crop(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
  """A random size x size crop (stateless; the image must be at least that large)."""
  crop = _random_window(image, tf.constant([size, size]), seed)
  crop.set_shape([size, size, image.shape[-1]])
  return crop


def pad_crop(image: tf.Tensor, pad: int, seed: tf.Tensor) -> tf.Tensor:
  """Zero-pads `pad` pixels on each side, then randomly crops back to the input size."""
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  crop = _random_window(padded, tf.shape(image)[:2], seed)
  crop.set_shape(image.shape)
  return crop


def _random_window(image: tf.Tensor, size_hw: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """A uniformly placed window of size_hw (as tf.image.stateless_random_crop, fewer ops)."""
  limit = tf.shape(image)[:2] - size_hw + 1
  offset = tf.math.floormod(
      tf.random.stateless_uniform([2], seed, minval=None, maxval=None, dtype=tf.int32), limit)
  return tf.slice(image, tf.concat([offset, [0]], 0), tf.concat([size_hw, [-1]], 0))


def inception_crop(image: tf.Tensor, size: int, seed: tf.Tensor,
                   area_range=INCEPTION_AREA_RANGE,
                   aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE) -> tf.Tensor:
  """Random area/aspect crop (stateless sample_distorted_bounding_box) resized to size x size."""
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image),
      bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=aspect_ratio_range,
      area_range=area_range,
      use_image_if_no_bounding_boxes=True)
  crop = tf.slice(image, begin, crop_size)
  crop.set_shape([None, None, image.shape[-1]])
  return resize(crop, size)


def random_flip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Flips left-right with probability 0.5 (stateless)."""
  return tf.image.stateless_random_flip_left_right(image, seed=seed)


def to_channels(image: tf.Tensor, channels: Optional[int]) -> tf.Tensor:
  """Converts 1 <-> 3 channels (gray is tiled; RGB uses tf luma weights); None keeps them."""
  have = image.shape[-1]
  if channels is None or channels == have:
    return image
  if have == 1 and channels == 3:
    return tf.tile(image, [1, 1, 3])
  if have == 3 and channels == 1:
    return tf.image.rgb_to_grayscale(image)
  raise UserError(f'cannot convert images with {have} channels to {channels}; use channels=None')


# ---------------------------------------------------------------------------------------------
# Whole preprocessing of one decoded image.


def train_preprocess(image: tf.Tensor, seed: tf.Tensor, spec: TrainSpec) -> tf.Tensor:
  """uint8 [H, W, C] image + [2] seed -> float32 [S, S, C'] in [-1, 1] (S = spec.image_size)."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  size = spec.image_size
  if spec.crop == 'inception':
    image = inception_crop(image, size, crop_seed)
  elif spec.crop == 'resize_crop':
    image = random_crop(resize_small(image, spec.resize), size, crop_seed)
  elif spec.crop == 'pad_crop':
    image = pad_crop(image, spec.pad, crop_seed)
    if tuple(image.shape[:2]) != (size, size):
      image = resize(image, size)
  elif spec.crop == 'resize':
    image = resize(image, size)
  else:
    raise UserError(f"train crop {spec.crop!r} is not one of {', '.join(TRAIN_CROPS)}")
  if spec.flip:
    image = random_flip(image, flip_seed)
  if spec.randaug_layers:
    image.set_shape([size, size, image.shape[-1]])
    pixels = tf.cast(tf.clip_by_value(tf.round(tf.cast(image, tf.float32)), 0, 255), tf.uint8)
    image = randaug.randaugment(pixels, spec.randaug_layers, spec.randaug_magnitude,
                                tf.random.experimental.stateless_fold_in(seed, 2))
  image = to_channels(tf.cast(image, tf.float32), spec.channels)
  image = value_range(image)
  image.set_shape([size, size, image.shape[-1]])
  return image


def eval_preprocess(image: tf.Tensor, spec: EvalSpec) -> tf.Tensor:
  """uint8 [H, W, C] image -> float32 [S, S, C'] in [-1, 1], deterministic."""
  size = spec.image_size
  if spec.crop == 'central':
    image = central_crop(resize_small(image, spec.resize), size)
  elif spec.crop == 'resize':
    image = resize(image, size)
  else:
    raise UserError(f"eval crop {spec.crop!r} is not one of {', '.join(EVAL_CROPS)}")
  image = to_channels(tf.cast(image, tf.float32), spec.channels)
  image = value_range(image)
  image.set_shape([size, size, image.shape[-1]])
  return image


def decode_channels(stored_shape) -> int:
  """Channels to decode a stored image feature to: 1 for grayscale, else 3 (alpha dropped)."""
  return 1 if stored_shape and stored_shape[-1] == 1 else 3


def output_channels(stored_shape, channels: Optional[int]) -> int:
  """Channels of the preprocessed images."""
  return channels if channels is not None else decode_channels(stored_shape)

