"""FlexiViT training: a patch size drawn for every step (`config.flexi_patch_sizes`, weighted by
`config.flexi_patch_probs`), as the FlexiViT paper's training (Sec. 3.3; big_vision's
`config.flexi.seqhw`).

The draw depends on the seed and the step only, so a resumed run draws the same sizes as an
uninterrupted one. Pure numpy: the check runs in the config's one validation, before JAX loads.
"""

from typing import Sequence, Tuple

import numpy as np

from vit_jax.errors import UserError


def check(config) -> None:
  """A one-line UserError for a patch-size list the run cannot draw from."""
  sizes, probs = tuple(config.flexi_patch_sizes), tuple(config.flexi_patch_probs)
  if not sizes:
    if probs:
      raise UserError('config.flexi_patch_probs is set but config.flexi_patch_sizes is empty: '
                      'list the patch sizes, e.g. config.flexi_patch_sizes=8,16,32')
    return
  if not config.model.flexi_patch:
    raise UserError(f'config.flexi_patch_sizes={",".join(map(str, sizes))} draws a patch size '
                    f'per step, which needs a FlexiViT: set config.model.flexi_patch (the stored '
                    f'kernel side, e.g. {max(sizes)}) and config.model.flexi_grid')
  if config.model.posemb == 'learned' and not config.model.flexi_grid:
    raise UserError('config.flexi_patch_sizes changes the token grid, which a learned position '
                    'embedding of one grid cannot follow: set config.model.flexi_grid (e.g. 7) '
                    'or config.model.posemb=sincos2d')
  for p in sizes:
    if not isinstance(p, int) or isinstance(p, bool) or p < 1 or config.image_size % p:
      raise UserError(f'config.flexi_patch_sizes has {p!r}, which does not divide the '
                      f'{config.image_size} px images into patches: use divisors of '
                      f'{config.image_size}')
  if probs and (len(probs) != len(sizes) or min(probs) < 0 or sum(probs) <= 0):
    raise UserError(f'config.flexi_patch_probs={",".join(map(str, probs))} must be one weight '
                    f'>= 0 per patch size ({len(sizes)}), not all 0: or leave it empty (uniform)')


def weights(sizes: Sequence[int], probs: Sequence[float]) -> np.ndarray:
  """The draw's probabilities (uniform when `probs` is empty)."""
  p = np.asarray(probs if probs else [1.] * len(sizes), np.float64)
  return p / p.sum()


def draw(sizes: Sequence[int], probs: Sequence[float], seed: int, step: int) -> int:
  """The patch size of training step `step` (a function of the seed and the step only)."""
  rng = np.random.default_rng([seed, step])
  return int(sizes[rng.choice(len(sizes), p=weights(sizes, probs))])


def of_config(config) -> Tuple[Tuple[int, ...], Tuple[float, ...]]:
  """(sizes, probs) of a config; sizes () when the run trains at the model's one patch size."""
  return tuple(config.flexi_patch_sizes), tuple(config.flexi_patch_probs)


__all__ = ['check', 'draw', 'of_config', 'weights']
