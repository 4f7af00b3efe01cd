"""Resizing a position embedding to another patch grid (pure numpy): the one interpolation that
transfer (`config.init`), predict, bundles and the analyses use at another image size.

`resize_posemb` keeps the cls row (if any) and interpolates the grid rows in 2-D, non-square grids
included. Interpolation (`method`) samples the old grid at corner-aligned positions: new index i of
n_new sits at old coordinate i * (n_old - 1) / (n_new - 1), as scipy.ndimage.zoom(order=1) in the
original code's `checkpoint.py` (`load_pretrained`). 'bilinear' is linear in each axis, equal to that zoom;
'bicubic' is Keys cubic convolution (a = -0.5) at the same positions, edge rows repeated.
"""

from typing import Tuple

import numpy as np

from vit_jax.errors import UserError

METHODS = ('bilinear', 'bicubic')
Grid = Tuple[int, int]


def _keys_cubic(s: np.ndarray, a: float = -0.5) -> np.ndarray:
  s = np.abs(s)
  near = ((a + 2) * s - (a + 3)) * s * s + 1
  far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
  return np.where(s <= 1, near, np.where(s < 2, far, 0.0))


def interpolation_matrix(n_old: int, n_new: int, method: str = 'bilinear') -> np.ndarray:
  """[n_new, n_old] float64 weights: resized = W @ values along one axis (corner-aligned)."""
  if method not in METHODS:
    raise UserError(f'unknown posemb resize method {method!r}: use config.init_posemb_resize= '
                    f'one of {", ".join(METHODS)}')
  if n_old < 1 or n_new < 1:
    raise UserError(f'cannot resize a position-embedding grid from {n_old} to {n_new} rows')
  if n_old == n_new:
    return np.eye(n_new)
  pos = np.arange(n_new) * ((n_old - 1) / (n_new - 1)) if n_new > 1 else np.zeros(1)
  weights = np.zeros((n_new, n_old))
  rows = np.arange(n_new)
  if method == 'bilinear' or n_old == 1:
    left = np.clip(np.floor(pos).astype(int), 0, max(n_old - 2, 0))
    frac = pos - left
    np.add.at(weights, (rows, left), 1.0 - frac)
    np.add.at(weights, (rows, np.minimum(left + 1, n_old - 1)), frac)
    return weights
  base = np.floor(pos).astype(int)
  for k in (-1, 0, 1, 2):
    idx = base + k
    np.add.at(weights, (rows, np.clip(idx, 0, n_old - 1)), _keys_cubic(pos - idx))
  return weights


def resize_posemb(posemb: np.ndarray, old_grid: Grid, new_grid: Grid, *, has_cls: bool,
                  method: str = 'bilinear') -> np.ndarray:
  """[1, (1+) gh*gw, D] -> [1, (1+) gh'*gw', D]: the cls row kept, the grid interpolated in 2-D.

  Tokens are in row-major grid order (row gh, column gw), as the patch embedding flattens them.
  """
  posemb = np.asarray(posemb)
  tokens, width = posemb.shape[1], posemb.shape[2]
  (gh, gw), (nh, nw) = tuple(old_grid), tuple(new_grid)
  if tokens != int(has_cls) + gh * gw:
    raise UserError(f'the position embedding has {tokens} tokens, not {int(has_cls)} + {gh}x{gw}'
                    f' for its grid: the checkpoint does not match the model it claims to be')
  cls, grid = posemb[:, :int(has_cls)], posemb[0, int(has_cls):].reshape(gh, gw, width)
  rows, cols = interpolation_matrix(gh, nh, method), interpolation_matrix(gw, nw, method)
  resized = np.einsum('ai,ijd,bj->abd', rows, grid.astype(np.float64), cols)
  resized = resized.reshape(1, nh * nw, width).astype(posemb.dtype)
  return np.concatenate([cls, resized], axis=1)


def square_grid(num_patches: int) -> Grid:
  side = int(round(num_patches ** 0.5))
  if side * side != num_patches:
    raise UserError(f'cannot tell the patch grid of a position embedding with {num_patches} '
                    f'patches (not a square): start from a training checkpoint, whose config '
                    f'gives the grid')
  return side, side


POSEMB_PATH = ('Transformer', 'posembed_input', 'pos_embedding')


def params_at_image_size(params, model, old_size: int, new_size: int, *,
                         method: str = 'bilinear'):
  """`params` (a nested dict) of `model` trained at `old_size`, for images of `new_size`: the
  learned position embedding resized to the new patch grid (a copy; the rest shared). Models
  without one (sincos2d / none posemb, BiT) need nothing and come back as they are."""
  from vit_jax.models.vit import has_cls, token_grid  # pylint: disable=g-import-not-at-top
  node = params
  for key in POSEMB_PATH:
    node = node.get(key) if hasattr(node, 'get') else None
  if node is None or old_size == new_size:
    return params
  old_grid, new_grid = token_grid(model, old_size), token_grid(model, new_size)
  unit = new_size // new_grid[0] if new_grid[0] else old_size // old_grid[0]
  if new_grid[0] < 1 or new_grid[0] * unit != new_size:
    raise UserError(f'--image_size={new_size} is not a multiple of the model\'s {unit}-pixel '
                    f'patches: pass a multiple of {unit}')
  resized = resize_posemb(np.asarray(node), old_grid, new_grid,
                          has_cls=has_cls(model.classifier), method=method)
  out = dict(params)
  inner = out
  for key in POSEMB_PATH[:-1]:
    inner[key] = dict(inner[key])
    inner = inner[key]
  inner[POSEMB_PATH[-1]] = resized
  return out


__all__ = ['METHODS', 'Grid', 'POSEMB_PATH', 'interpolation_matrix', 'params_at_image_size',
           'resize_posemb', 'square_grid']
