"""RandAugment (Cubuk et al. 2020) as a stateless TensorFlow op: runs in tf.data, explicit seeds.

`randaugment(image, num_layers, magnitude, seed)` applies `num_layers` ops in sequence to a uint8
[H, W, C] image (C = 1 or 3), each drawn uniformly from `OPS` and always applied, at strength
`magnitude` on the scale where 10 is each op's maximum in the RandAugment paper (AugReg uses
magnitudes 10 to 20; larger values extrapolate the same linear maps). With m = magnitude / 10:

  AutoContrast   stretch each channel's [min, max] to [0, 255]            (no magnitude)
  Equalize       histogram-equalise each channel (PIL's ImageOps.equalize) (no magnitude)
  Invert         255 - x                                                  (no magnitude)
  Rotate         by 30 m degrees, random direction                        (nearest, fill 128)
  Posterize      keep the int(4 m) high bits (0 bits: black; 8 bits: unchanged)
  Solarize       invert pixels >= int(256 m)
  SolarizeAdd    add int(110 m) to pixels < 128 (clipped at 255)
  Color          blend with the grayscale image by factor 1.8 m + 0.1    (1 = unchanged)
  Contrast       blend with the mean gray level by factor 1.8 m + 0.1
  Brightness     blend with black by factor 1.8 m + 0.1
  Sharpness      blend with the 3x3 smoothed image (PIL's SMOOTH kernel, border kept) by 1.8 m + 0.1
  ShearX/ShearY  shear by 0.3 m, random direction                         (nearest, fill 128)
  TranslateX/Y   shift by 0.45 m of the side (100 px of 224), random direction (fill 128)
  Cutout         a square of side 2 int(0.18 m * side) (40 px half-side at 224) at a uniform
                 random centre set to 128

These are the ops, maps and constants of the TF RandAugment that big_vision archives, with two
deliberate differences: translation and cutout scale with the image side (the originals are fixed
pixel counts for 224 px images), and Contrast blends with the true mean gray level (as PIL).
Blends are x' = d + f (x - d) for the degenerate image d, rounded down and clipped to [0, 255].
A [2] int64 seed fixes every choice, so a pipeline stays a pure function of its seeds.
"""

import math

from vit_jax import lazy
from vit_jax.errors import UserError

tf = lazy.Module('tensorflow')  # imported when an op runs (config validation reads `check`)

MAX_LEVEL = 10.0
FILL = 128
TRANSLATE_FRACTION = 100 / 224
CUTOUT_FRACTION = 40 / 224
SMOOTH_KERNEL = ((1., 1., 1.), (1., 5., 1.), (1., 1., 1.))  # / 13


# ---------------------------------------------------------------------------------------------
# Pixel ops: uint8 [H, W, C] -> uint8 [H, W, C].


def _float(image):
  return tf.cast(image, tf.float32)


def _to_uint8(x):
  return tf.cast(tf.clip_by_value(tf.floor(x), 0.0, 255.0), tf.uint8)


def blend(degenerate, image, factor):
  """d + factor * (x - d), floored and clipped to uint8 (factor 1 gives the image back)."""
  d = _float(degenerate)
  return _to_uint8(d + factor * (_float(image) - d))


def invert(image):
  return 255 - image


def posterize(image, bits: int):
  """Keeps the `bits` (0..8) most significant bits of every value."""
  keep = (0xFF << (8 - int(bits))) & 0xFF
  return tf.bitwise.bitwise_and(image, tf.constant(keep, tf.uint8))


def solarize(image, threshold):
  return tf.where(_float(image) < tf.cast(threshold, tf.float32), image, 255 - image)


def solarize_add(image, addition, threshold=128):
  added = _to_uint8(_float(image) + tf.cast(addition, tf.float32))
  return tf.where(image < threshold, added, image)


def grayscale(image):
  """uint8 luma (ITU-R 601-2, as PIL's convert('L')) broadcast to the image's channels."""
  if image.shape[-1] == 1:
    return image
  luma = tf.tensordot(_float(image), tf.constant([0.299, 0.587, 0.114]), axes=1)[..., None]
  return tf.tile(_to_uint8(luma + 0.5), [1, 1, 3])


def color(image, factor):
  return blend(grayscale(image), image, factor)


def contrast(image, factor):
  mean = tf.floor(tf.reduce_mean(_float(grayscale(image)[..., :1])) + 0.5)
  return blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image, factor):
  return blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor):
  x = _float(image)[None]
  channels = image.shape[-1]
  kernel = tf.tile(tf.constant(SMOOTH_KERNEL)[:, :, None, None] / 13.0, [1, 1, channels, 1])
  smooth = tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], padding='VALID')[0]
  smooth = tf.floor(smooth + 0.5)
  inner = tf.ones_like(smooth, tf.bool)
  mask = tf.pad(inner, [[1, 1], [1, 1], [0, 0]], constant_values=False)
  degenerate = tf.where(mask, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), x[0])
  return blend(degenerate, image, factor)


def autocontrast(image):
  """Each channel's [lo, hi] -> [0, 255] (unchanged where hi == lo)."""
  x = _float(image)
  lo = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  hi = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = _to_uint8((x - lo) * scale)
  return tf.where(hi > lo, stretched, image)


def _equalize_channel(channel):
  """PIL's ImageOps.equalize on one uint8 [H, W] channel."""
  hist = tf.math.bincount(tf.cast(tf.reshape(channel, [-1]), tf.int32), minlength=256,
                          maxlength=256)
  nonzero = tf.boolean_mask(hist, hist > 0)
  step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
  safe = tf.maximum(step, 1)
  lut = (tf.cumsum(hist) + safe // 2) // safe
  lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
  equalized = tf.cast(tf.gather(lut, tf.cast(channel, tf.int32)), tf.uint8)
  return tf.where(step > 0, equalized, channel)


def equalize(image):
  return tf.stack([_equalize_channel(image[..., c]) for c in range(image.shape[-1])], axis=-1)


def cutout(image, half_side, seed):
  """Sets a (2 half_side)^2 square (clipped at the borders) at a uniform random centre to 128."""
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  centre = tf.random.stateless_uniform([2], seed, minval=0, maxval=tf.int32.max, dtype=tf.int32)
  cy, cx = centre[0] % h, centre[1] % w
  rows, cols = tf.range(h)[:, None], tf.range(w)[None, :]
  inside = ((rows >= cy - half_side) & (rows < cy + half_side) & (cols >= cx - half_side)
            & (cols < cx + half_side))
  return tf.where(inside[..., None], tf.cast(FILL, image.dtype), image)


# ---------------------------------------------------------------------------------------------
# Geometric ops: output pixel (x, y) reads input pixel (a0 x + a1 y + a2, b0 x + b1 y + b2).


def affine(image, transform):
  """Nearest-neighbour affine resampling with [a0, a1, a2, b0, b1, b2]; outside pixels are 128."""
  transform = tf.concat([tf.cast(transform, tf.float32), tf.zeros([2])], 0)[None]
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=transform, output_shape=tf.shape(image)[:2],
      fill_value=float(FILL), interpolation='NEAREST', fill_mode='CONSTANT')
  return tf.ensure_shape(out[0], image.shape)


def rotate(image, degrees):
  """Rotates the content counter-clockwise (as displayed) about the image centre."""
  angle = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(angle), tf.sin(angle)
  h, w = tf.cast(tf.shape(image)[0] - 1, tf.float32), tf.cast(tf.shape(image)[1] - 1, tf.float32)
  x_offset = (w - (cos * w - sin * h)) / 2.0
  y_offset = (h - (sin * w + cos * h)) / 2.0
  return affine(image, tf.stack([cos, -sin, x_offset, sin, cos, y_offset]))


def shear_x(image, shear):
  """Row y moves left by shear * y pixels (it reads input column x + shear * y)."""
  return affine(image, tf.stack([1.0, tf.cast(shear, tf.float32), 0.0, 0.0, 1.0, 0.0]))


def shear_y(image, shear):
  return affine(image, tf.stack([1.0, 0.0, 0.0, tf.cast(shear, tf.float32), 1.0, 0.0]))


def translate_x(image, pixels):
  """The content moves right by `pixels`."""
  return affine(image, tf.stack([1.0, 0.0, -tf.cast(pixels, tf.float32), 0.0, 1.0, 0.0]))


def translate_y(image, pixels):
  return affine(image, tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, -tf.cast(pixels, tf.float32)]))


# ---------------------------------------------------------------------------------------------
# RandAugment.


def _signed(value, seed):
  negate = tf.random.stateless_uniform([], seed) < 0.5
  return tf.where(negate, -value, value)


def _ops(magnitude: float, side: int):
  """[(name, fn(image, seed) -> image)] at this magnitude, in the original's order."""
  m = magnitude / MAX_LEVEL
  factor = m * 1.8 + 0.1
  translate = m * TRANSLATE_FRACTION * side
  half = int(m * CUTOUT_FRACTION * side)
  return [
      ('AutoContrast', lambda x, s: autocontrast(x)),
      ('Equalize', lambda x, s: equalize(x)),
      ('Invert', lambda x, s: invert(x)),
      ('Rotate', lambda x, s: rotate(x, _signed(m * 30.0, s))),
      ('Posterize', lambda x, s: posterize(x, min(8, int(m * 4)))),
      ('Solarize', lambda x, s: solarize(x, int(m * 256))),
      ('Color', lambda x, s: color(x, factor)),
      ('Contrast', lambda x, s: contrast(x, factor)),
      ('Brightness', lambda x, s: brightness(x, factor)),
      ('Sharpness', lambda x, s: sharpness(x, factor)),
      ('ShearX', lambda x, s: shear_x(x, _signed(m * 0.3, s))),
      ('ShearY', lambda x, s: shear_y(x, _signed(m * 0.3, s))),
      ('TranslateX', lambda x, s: translate_x(x, _signed(translate, s))),
      ('TranslateY', lambda x, s: translate_y(x, _signed(translate, s))),
      ('Cutout', lambda x, s: cutout(x, half, s)),
      ('SolarizeAdd', lambda x, s: solarize_add(x, int(m * 110))),
  ]


OPS = tuple(name for name, _ in _ops(10.0, 224))


def apply_op(image, index, magnitude: float, seed):
  """Applies op number `index` (a scalar tensor into OPS) at `magnitude`."""
  branches = [lambda fn=fn: fn(image, seed) for _, fn in _ops(magnitude, image.shape[0])]
  return tf.ensure_shape(tf.switch_case(tf.cast(index, tf.int32), branches), image.shape)


def check(num_layers, magnitude) -> None:
  """UserError unless num_layers is an int >= 0 and magnitude a number >= 0."""
  if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 0:
    raise UserError(f'num_layers={num_layers!r} must be an int >= 0 (0 = off)')
  if isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)) or magnitude < 0:
    raise UserError(f'magnitude={magnitude!r} must be a number >= 0 (10 = each op at '
                    f'its RandAugment maximum)')


def randaugment(image, num_layers: int, magnitude: float, seed):
  """uint8 [H, W, C] (static shape) -> uint8, `num_layers` random ops in sequence."""
  check(num_layers, magnitude)
  if not num_layers:
    return image
  seeds = tf.random.experimental.stateless_split(seed, num=2 * num_layers)
  for layer in range(num_layers):
    index = tf.random.stateless_uniform([], seeds[2 * layer], minval=0, maxval=len(OPS),
                                        dtype=tf.int32)
    image = apply_op(image, index, float(magnitude), seeds[2 * layer + 1])
  return image


__all__ = ['OPS', 'affine', 'apply_op', 'autocontrast', 'blend', 'brightness', 'check', 'color',
           'contrast',
           'cutout', 'equalize', 'grayscale', 'invert', 'posterize', 'randaugment', 'rotate',
           'sharpness', 'shear_x', 'shear_y', 'solarize', 'solarize_add', 'translate_x',
           'translate_y']
