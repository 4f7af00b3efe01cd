"""Preprocessing ops by name: one registered function each, run by every input pipeline.

A config gives its train and eval preprocessing as lists of op calls joined by `|`
(`config.pp.train='inception_crop|flip|randaug(2, 15)'`, `config.pp.eval='central_crop'`): the one
way a config says its preprocessing. Config validation parses them once (`specs.of_config`) and
the run passes the parsed lists on.

An op is `fn(image, ctx, *args) -> image`: `image` is [H, W, C] with values in [0, 255] (uint8 or
float32), the decoded image for the first op; `ctx.size` is the output side (`config.image_size`)
and, for an op registered with `random=True`, `ctx.seed` its stateless [2] int64 seed (None for
the others). The pipeline scales the last op's output from [0, 255] to [-1, 1]; it must be
ctx.size x ctx.size, with the image's channels unless a `channels(n)` op changed them. An op may
register `check(size, **arguments)`, which config validation runs (no TensorFlow) and which
raises `UserError` for a bad argument.

Seeds (`op_seed`): op i of a list draws from slot i of the example's seed (the seed of its run,
process and stream position, `preprocess.example_seed`), so every random op's draws are a pure
function of (run seed, process, position, i): a stream stays exactly resumable whatever ops it
runs.

Adding an op: one registered function here (or in the config file that names it, which registers
it when loaded), and its test; docs/data.md lists every op (tests check the table).
"""

import dataclasses
from typing import Any, Optional, Tuple

from vit_jax import lazy
from vit_jax import registry
from vit_jax.data import randaug as randaug_lib
from vit_jax.errors import UserError

tf = lazy.Module('tensorflow')  # imported when an op runs, not when a config is checked

OPS = registry.Registry('preprocessing op', leading=('image', 'ctx'), docs='docs/data.md')
register = OPS.register

INCEPTION_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


@dataclasses.dataclass(frozen=True)
class Context:
  """What an op gets besides the image: the output side and, for a random op, its seed."""
  size: int
  seed: Any = None


def op_seed(seed, slot: int):
  """The stateless seed of list slot `slot` from an example's [2] seed: the two halves of
  `stateless_split(seed)` for slots 0 and 1, `stateless_fold_in(seed, slot)` after."""
  if slot < 2:
    return tf.unstack(tf.random.experimental.stateless_split(seed, num=2))[slot]
  return tf.random.experimental.stateless_fold_in(seed, slot)


# ---------------------------------------------------------------------------------------------
# Argument checks (run by config validation, without TensorFlow).


def _int_at_least(value, name: str, minimum: int, meaning: str) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise UserError(f'{name} ({meaning}) must be an int >= {minimum}, got {value!r}')


def _check_resize(size: Optional[int], resize) -> None:
  if resize is not None:
    _int_at_least(resize, 'resize', size or 1, f'the shorter side, >= the output side {size}')


def _check_area(size, area_min, area_max) -> None:
  del size
  if not (isinstance(area_min, (int, float)) and isinstance(area_max, (int, float))
          and 0 < area_min <= area_max <= 1):
    raise UserError(f'area_min={area_min!r}, area_max={area_max!r} must be fractions with '
                    f'0 < area_min <= area_max <= 1')


# ---------------------------------------------------------------------------------------------
# Helpers shared by ops (and by prediction's decoding, image_files.py).


def resize_to(image, size: int):
  """The whole image bilinear-resized to size x size (no antialias, aspect not kept), float32."""
  return tf.image.resize(image, [size, size], method='bilinear', antialias=False)


def resize_small(image, size: int):
  """Resized so that the shorter side is `size`, keeping the aspect ratio (float32); bilinear
  with antialiasing (a proper filter when shrinking)."""
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  ratio = tf.cast(size, tf.float32) / tf.minimum(h, w)
  new_h = tf.maximum(tf.cast(tf.round(h * ratio), tf.int32), size)
  new_w = tf.maximum(tf.cast(tf.round(w * ratio), tf.int32), size)
  return tf.image.resize(image, tf.stack([new_h, new_w]), method='bilinear', antialias=True)


def random_window(image, size_hw, seed):
  """A uniformly placed window of size_hw (as tf.image.stateless_random_crop, fewer ops)."""
  limit = tf.shape(image)[:2] - size_hw + 1
  offset = tf.math.floormod(
      tf.random.stateless_uniform([2], seed, minval=None, maxval=None, dtype=tf.int32), limit)
  return tf.slice(image, tf.concat([offset, [0]], 0), tf.concat([size_hw, [-1]], 0))


def to_channels(image, n: Optional[int]):
  """Converts 1 <-> 3 channels (gray is tiled; RGB uses tf luma weights); None keeps them."""
  have = image.shape[-1]
  if n is None or n == have:
    return image
  if have == 1 and n == 3:
    return tf.tile(image, [1, 1, 3])
  if have == 3 and n == 1:
    return tf.image.rgb_to_grayscale(image)
  raise UserError(f'cannot convert images with {have} channels to {n}; use channels 1 or 3')


# ---------------------------------------------------------------------------------------------
# The ops.


@register('inception_crop', random=True, check=_check_area)
def inception_crop(image, ctx, area_min=0.05, area_max=1.0):
  """A random crop of area_min to area_max of the image's area and aspect ratio 3/4 to 4/3
  (stateless sample_distorted_bounding_box; the whole image if no box fits), resized to the
  output side (bilinear, no antialias), as the original fine-tuning code."""
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.zeros([0, 0, 4], tf.float32), seed=ctx.seed,
      min_object_covered=0.0, aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
      area_range=(area_min, area_max), use_image_if_no_bounding_boxes=True)
  crop = tf.slice(image, begin, crop_size)
  crop.set_shape([None, None, image.shape[-1]])
  return resize_to(crop, ctx.size)


@register('resize_crop', random=True, check=_check_resize)
def resize_crop(image, ctx, resize=None):
  """The shorter side resized to `resize` (default: the output side; bilinear with
  antialiasing), then a random square of the output side."""
  crop = random_window(resize_small(image, resize or ctx.size), tf.constant([ctx.size] * 2),
                       ctx.seed)
  crop.set_shape([ctx.size, ctx.size, image.shape[-1]])
  return crop


@register('pad_crop', random=True,
          check=lambda size, pad: _int_at_least(pad, 'pad', 0, 'pixels of zero padding per side'))
def pad_crop(image, ctx, pad=0):
  """`pad` zero pixels added on each side, then a random window of the input's size (random
  shifts of up to `pad` pixels), resized to the output side (bilinear) if that differs."""
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  crop = random_window(padded, tf.shape(image)[:2], ctx.seed)
  crop.set_shape(image.shape)
  if tuple(crop.shape[:2]) != (ctx.size, ctx.size):
    crop = resize_to(crop, ctx.size)
  return crop


@register('resize')
def resize(image, ctx):
  """The whole image resized to the output side (bilinear, no antialias, aspect ratio not kept),
  as the original fine-tuning code."""
  return resize_to(image, ctx.size)


@register('central_crop', check=_check_resize)
def central_crop(image, ctx, resize=None):
  """The shorter side resized to `resize` (default: the output side; bilinear with
  antialiasing), then the central square of the output side."""
  image = resize_small(image, resize or ctx.size)
  shape = tf.shape(image)
  top, left = (shape[0] - ctx.size) // 2, (shape[1] - ctx.size) // 2
  crop = tf.slice(image, tf.stack([top, left, 0]), tf.stack([ctx.size, ctx.size, -1]))
  crop.set_shape([ctx.size, ctx.size, image.shape[-1]])
  return crop


@register('flip', random=True)
def flip(image, ctx):
  """A left-right flip with probability 1/2."""
  return tf.image.stateless_random_flip_left_right(image, seed=ctx.seed)


@register('randaug', random=True,
          check=lambda size, num_layers, magnitude: randaug_lib.check(num_layers, magnitude))
def randaug(image, ctx, num_layers=2, magnitude=10):
  """RandAugment (vit_jax/data/randaug.py): `num_layers` ops drawn at random, each at
  `magnitude` (10 = each op's maximum in the RandAugment paper), on the image rounded to uint8."""
  image.set_shape([ctx.size, ctx.size, image.shape[-1]])
  pixels = tf.cast(tf.clip_by_value(tf.round(tf.cast(image, tf.float32)), 0, 255), tf.uint8)
  return randaug_lib.randaugment(pixels, num_layers, magnitude, ctx.seed)


def _check_channels(size, n) -> None:
  del size
  if n not in (1, 3):
    raise UserError(f'n={n!r} must be 1 or 3')


@register('channels', check=_check_channels)
def channels(image, ctx, n):
  """`n` channels: gray tiled to RGB for 3, RGB to luma (tf.image.rgb_to_grayscale) for 1."""
  del ctx
  return to_channels(tf.cast(image, tf.float32), n)


# ---------------------------------------------------------------------------------------------
# Lists: parsed, checked, run.


@dataclasses.dataclass(frozen=True)
class OpList:
  """Checked calls of registered ops (op i draws from seed slot i), and the output side."""
  calls: Tuple[registry.Call, ...]
  size: int

  def __str__(self) -> str:
    return '|'.join(str(c) for c in self.calls)

  @property
  def random(self) -> bool:
    return any(OPS.get(c.name).attrs.get('random') for c in self.calls)

  def channels(self) -> Optional[int]:
    """The channels the last `channels(n)` op gives, or None (those of the stored image)."""
    counts = [_channels_arg(c) for c in self.calls if c.name == 'channels']
    return counts[-1] if counts else None

  def at_size(self, size: int) -> 'OpList':
    """The same ops for `size` px outputs, each `resize` side (the shorter side before a crop)
    scaled with the output."""
    scaled = lambda k, v: round(v * size / self.size) if k == 'resize' and v else v
    calls = tuple(dataclasses.replace(c, kwargs=tuple((k, scaled(k, v)) for k, v in c.kwargs))
                  for c in self.calls)
    return OpList(calls, size)


def _channels_arg(call: registry.Call) -> int:
  return call.args[0] if call.args else call.keywords['n']


def parse(text: str, size: int, key: str) -> OpList:
  """The op list of `text` ('pad_crop(pad=2)|flip'), checked (UserError naming `key`)."""
  if isinstance(text, str) and not text.strip():
    raise UserError(f'config.{key} is empty: name at least one op, e.g. resize')
  calls = OPS.parse(text, key)
  for call in calls:
    OPS.check(call, key, size)
  return OpList(calls, size)


def apply(ops: OpList, image, seed=None, channels: Optional[int] = None):
  """uint8 [H, W, C] -> float32 [S, S, C'] in [-1, 1] (S = ops.size): the ops in turn (random
  ones seeded from the example's `seed`), then [0, 255] -> [-1, 1]. `channels`: the C' the
  pipeline expects (UserError if the ops give other images)."""
  for slot, call in enumerate(ops.calls):
    entry = OPS.get(call.name)
    random = entry.attrs.get('random')
    if random and seed is None:
      raise UserError(f'{call.name} is a random op: eval preprocessing must be deterministic')
    ctx = Context(ops.size, op_seed(seed, slot) if random else None)
    image = entry.fn(image, ctx, *call.args, **call.keywords)
  image = (tf.cast(image, tf.float32) - 127.5) / 127.5
  want = [ops.size, ops.size, channels]
  if image.shape.rank != 3 or not image.shape.is_compatible_with(want):
    raise UserError(f'preprocessing {ops} gives images of shape {image.shape}, not {want}: end '
                    f'with an op that gives image_size x image_size (a crop or resize), and change '
                    f'channels only with channels(n)')
  image.set_shape(want)
  return image


def table() -> str:
  """The markdown table of every registered op (docs/data.md holds it; a test checks)."""
  return OPS.table((('random', lambda entry: 'yes' if entry.attrs.get('random') else ''),))


__all__ = ['Context', 'OPS', 'OpList', 'apply', 'op_seed', 'parse', 'register', 'resize_small',
           'resize_to', 'table', 'to_channels']
