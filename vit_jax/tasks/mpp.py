"""Masked patch prediction: the paper's self-supervised pre-training (ViT paper, §4.6 and App.
B.1.2).

Per image, `ratio` (50%) of the patch embeddings are selected and corrupted: with probability
`mask_prob` (80%) replaced by a learnable [mask] embedding, with `random_prob` (10%) by the
embedding of another patch of the same image (a uniformly drawn other position), else (10%) kept
as they are. The model predicts, from each selected patch's output token, the 3-bit mean colour of
that patch: the mean of each channel over the patch's pixels, quantised to 8 levels, so
8**channels classes (512 for RGB, 8 for grayscale). The loss is the softmax cross-entropy averaged
over the selected patches; the accuracy is the fraction of them predicted right.

The corruption is a function of the step's RNG and happens inside the model, after the patch
embedding and before the cls token and position embedding (`VisionTransformer(with_mask_token=
True)` and its `corrupt` argument); the model is the usual ViT with classifier 'unpooled' and a
per-token head of 8**channels classes. The mask token and this head are dropped when the
checkpoint fine-tunes (vit_jax/train/transfer.py).
"""

from __future__ import annotations  # jax.Array annotations: jax loads when a step runs

from typing import Callable, Tuple

from vit_jax import lazy
from vit_jax.errors import UserError
from vit_jax.tasks import losses

jax = lazy.Module('jax')  # imported when a step is traced
jnp = lazy.Module('jax.numpy')

BITS = 3
LEVELS = 2 ** BITS


def num_colour_classes(channels: int) -> int:
  return LEVELS ** channels


def colour_targets(images: jax.Array, patch_pixels: Tuple[int, int]) -> jax.Array:
  """int32 [B, N]: the 3-bit mean-colour class of every patch (row-major) of images in [-1, 1].

  Class = sum_c level_c * 8**(C-1-c), level_c = min(7, floor(8 * mean_c)) of the patch's mean of
  channel c rescaled to [0, 1].
  """
  b, h, w, c = images.shape
  ph, pw = patch_pixels
  gh, gw = h // ph, w // pw
  x = (images[:, :gh * ph, :gw * pw].astype(jnp.float32) + 1.0) / 2.0
  means = x.reshape(b, gh, ph, gw, pw, c).mean(axis=(2, 4)).reshape(b, gh * gw, c)
  levels = jnp.clip(jnp.floor(means * LEVELS), 0, LEVELS - 1).astype(jnp.int32)
  weights = LEVELS ** jnp.arange(c - 1, -1, -1, dtype=jnp.int32)
  return jnp.sum(levels * weights, axis=-1)


def sample_corruption(rng: jax.Array, batch: int, num_patches: int, *, ratio: float = 0.5,
                      mask_prob: float = 0.8, random_prob: float = 0.1) -> dict:
  """{'selected', 'use_mask': bool [B, N], 'source': int32 [B, N]} for one batch.

  Exactly round(ratio * N) patches (at least 1) are selected per image. `source[b, i]` is the
  patch whose embedding goes to position i: i itself, or another position for a random swap.
  """
  count = max(1, int(round(ratio * num_patches)))
  select_rng, kind_rng, other_rng = jax.random.split(rng, 3)
  order = jnp.argsort(jax.random.uniform(select_rng, (batch, num_patches)), axis=1)
  rank = jnp.argsort(order, axis=1)
  selected = rank < count
  kind = jax.random.uniform(kind_rng, (batch, num_patches))
  use_mask = selected & (kind < mask_prob)
  use_random = selected & (kind >= mask_prob) & (kind < mask_prob + random_prob)
  positions = jnp.arange(num_patches, dtype=jnp.int32)
  offset = jax.random.randint(other_rng, (batch, num_patches), 1, num_patches, dtype=jnp.int32)
  source = jnp.where(use_random, (positions + offset) % num_patches, positions)
  return {'selected': selected, 'use_mask': use_mask, 'source': source}


def check(config, grid: Tuple[int, int]) -> None:
  c = config.mpp
  if not 0.0 < c.ratio <= 1.0:
    raise UserError(f'mpp.ratio={c.ratio} is not in (0, 1]: use e.g. 0.5 (the paper)')
  if c.mask_prob < 0 or c.random_prob < 0 or c.mask_prob + c.random_prob > 1.0:
    raise UserError(f'mpp.mask_prob={c.mask_prob} and mpp.random_prob={c.random_prob} must be '
                    f'>= 0 with a sum <= 1: use 0.8 and 0.1 (the paper)')
  if grid[0] * grid[1] < 2:
    raise UserError(f'masked patch prediction needs at least 2 patches, the model has a '
                    f'{grid[0]}x{grid[1]} grid: raise config.image_size')
  if config.mixup:
    raise UserError('mixup does not apply to masked patch prediction: set config.mixup=0')


def _scores(apply_fn, variables, images, rng, *, grid, patch_pixels, options, train):
  """Per-image (mean loss over the selected patches, fraction of them right); `variables` is
  what `apply_fn` takes ({'params': ...})."""
  corrupt_rng, dropout_rng = jax.random.split(rng)
  num_patches = grid[0] * grid[1]
  corrupt = sample_corruption(corrupt_rng, images.shape[0], num_patches, ratio=options['ratio'],
                              mask_prob=options['mask_prob'], random_prob=options['random_prob'])
  logits = apply_fn(variables, images, train=train, rngs={'dropout': dropout_rng},
                    corrupt=corrupt)
  logits = logits[:, -num_patches:]  # drop the cls token's output
  targets = colour_targets(images, patch_pixels)
  xent = losses.softmax_xent(logits, jax.nn.one_hot(targets, logits.shape[-1]))
  selected = corrupt['selected'].astype(jnp.float32)
  per_image = jnp.sum(selected, axis=1)
  loss = jnp.sum(xent * selected, axis=1) / per_image
  hits = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return loss, jnp.sum(hits * selected, axis=1) / per_image


def _options(config) -> dict:
  return {k: float(config.mpp[k]) for k in ('ratio', 'mask_prob', 'random_prob')}


def make_objective(config, *, apply_fn: Callable, grid, patch_pixels) -> Callable:
  """objective(variables, images, labels, rng) -> (mean loss, summed per-image patch accuracy)."""
  options = _options(config)

  def objective(variables, images, labels, rng):
    del labels  # self-supervised
    loss, accuracy = _scores(apply_fn, variables, images, rng, grid=grid, patch_pixels=patch_pixels,
                             options=options, train=True)
    return jnp.mean(loss), jnp.sum(accuracy)

  return objective


def make_eval_step(config, *, apply_fn: Callable, grid, patch_pixels, seed: int = 0) -> Callable:
  """eval_step(params, batch) -> sums of per-image patch accuracy ('correct'), loss and count.

  The corruption is drawn from a fixed key, so every evaluation scores the same task.
  """
  options = _options(config)

  def eval_step(params, batch):
    loss, accuracy = _scores(apply_fn, {'params': params}, batch['image'],
                             jax.random.PRNGKey(seed), grid=grid, patch_pixels=patch_pixels,
                             options=options, train=False)
    mask = batch['mask'].astype(jnp.float32)
    return {'correct': jnp.sum(accuracy * mask), 'loss': jnp.sum(loss * mask),
            'count': jnp.sum(mask)}

  return eval_step


__all__ = ['colour_targets', 'make_eval_step', 'make_objective', 'num_colour_classes',
           'sample_corruption']
