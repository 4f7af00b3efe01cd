"""FlexiViT training: a patch size drawn for every step (`config.flexi_patch_sizes`, weighted by
`config.flexi_patch_probs`), as the FlexiViT paper's training (Sec. 3.3; big_vision's
`config.flexi.seqhw`); the patch sizes its evaluators score at are checked here too.

The draw depends on the seed and the step only, so a resumed run draws the same sizes as an
uninterrupted one. Pure numpy: the check runs in the config's one validation, before JAX loads.
"""

from typing import Sequence, Tuple

import numpy as np

from vit_jax.errors import UserError


def check(config) -> None:
  """A one-line UserError for a patch-size list the run cannot draw from, or an evaluator entry's
  `patch_sizes` (config.evals.NAME.patch_sizes) it cannot score at."""
  sizes, probs = tuple(config.flexi_patch_sizes), tuple(config.flexi_patch_probs)
  if probs and not sizes:
    raise UserError('config.flexi_patch_probs is set but config.flexi_patch_sizes is empty: '
                    'list the patch sizes, e.g. config.flexi_patch_sizes=8,16,32')
  if sizes:
    _check_sizes(config, sizes, 'config.flexi_patch_sizes', 'draws a patch size per step')
  if probs and (len(probs) != len(sizes) or min(probs) < 0 or sum(probs) <= 0):
    raise UserError(f'config.flexi_patch_probs={",".join(map(str, probs))} must be one weight '
                    f'>= 0 per patch size ({len(sizes)}), not all 0: or leave it empty (uniform)')
  for name, entry in config.evals.items():
    scored = entry.get('patch_sizes') if hasattr(entry, 'get') else None
    if scored is None:
      continue
    key = f'config.evals.{name}.patch_sizes'
    if not isinstance(scored, (tuple, list)):
      raise UserError(f'{key}={scored!r} must be a list of patch sizes, e.g. {key}=8,16 (or () '
                      'for the model\'s own only)')
    if scored:
      _check_sizes(config, tuple(scored), key, 'scores the model at those patch sizes')


def _check_sizes(config, sizes: Tuple[int, ...], key: str, what: str) -> None:
  """The patch sizes `sizes` of config key `key`, which `what` (said in the error), against the
  model (a FlexiViT that can change its token grid) and the image size."""
  if not config.model.flexi_patch:
    raise UserError(f'{key}={",".join(map(str, sizes))} {what}, which needs a FlexiViT: set '
                    f'config.model.flexi_patch (the stored kernel side, e.g. {max(sizes)}) and '
                    'config.model.flexi_grid')
  if config.model.posemb == 'learned' and not config.model.flexi_grid:
    raise UserError(f'{key} changes the token grid, which a learned position embedding of one '
                    'grid cannot follow: set config.model.flexi_grid (e.g. 7) or '
                    'config.model.posemb=sincos2d')
  for p in sizes:
    if not isinstance(p, int) or isinstance(p, bool) or p < 1 or config.image_size % p:
      raise UserError(f'{key} has {p!r}, which does not divide the {config.image_size} px '
                      f'images into patches: use divisors of {config.image_size}')


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
