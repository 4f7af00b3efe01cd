"""FlexiViT's flexible patch embedding (Beyer et al. 2023, "FlexiViT: One Model for All Patch
Sizes"): one set of parameters that runs at any patch size.

The model keeps an underlying patch kernel (`model.flexi_patch` x `flexi_patch`) and an underlying
learned position-embedding grid (`model.flexi_grid` x `flexi_grid`), and at call time resizes
- the kernel to the requested patch size by pseudo-inverse resize (PI-resize, the paper's
  Sec. 3.4): with B the bilinear resize matrix that maps a flattened p x p patch to p' x p', the
  new kernel is w' = pinv(B^T) w, so that <x, w> = <B x, w'> for every patch x when p' >= p (a
  patch upsampled by the same bilinear resize gives the same token);
- the position embeddings to the token grid by `jax.image.resize` (`flexi_resize`, one of
  models/option_values.py's FLEXI_RESIZES: bilinear by
  default; half-pixel centres, antialiased when shrinking), as big_vision's
  models/proj/flexi/vit.py.

B is separable (B = R_h kron R_w, one 1-D matrix per axis), and so is its pseudo-inverse
(pinv(A kron C) = pinv(A) kron pinv(C)): the kernel is resized one axis at a time. The 1-D
matrices are the bilinear resize with half-pixel centres and no antialiasing, the resize of
`tf.image.resize(method='bilinear')` that big_vision uses (it matches its preprocessing).
"""

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.errors import UserError


def initializer(width: int):
  """The initializer of a FlexiViT's stored patch kernel and learned position embedding:
  normal with stddev 1/sqrt(width), as big_vision's models/proj/flexi/vit.py (its `Patchify`
  kernel and `get_posemb`), where the plain ViT draws the kernel lecun-normal and the position
  embedding with stddev 0.02."""
  return jax.nn.initializers.normal(stddev=1 / np.sqrt(width))


@functools.cache
def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in] float64: resized = M @ values along one axis; half-pixel centres (output i
  samples input coordinate (i + 0.5) n_in / n_out - 0.5), edges clamped, no antialiasing."""
  pos = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
  low = np.floor(pos)
  frac = pos - low
  lo = np.clip(low, 0, n_in - 1).astype(int)
  hi = np.clip(low + 1, 0, n_in - 1).astype(int)
  out = np.zeros((n_out, n_in))
  rows = np.arange(n_out)
  np.add.at(out, (rows, lo), 1. - frac)
  np.add.at(out, (rows, hi), frac)
  return out


@functools.cache
def _pinv_t(n_in: int, n_out: int) -> np.ndarray:
  """pinv(R^T) [n_out, n_in] of the 1-D bilinear resize R from n_in to n_out samples."""
  return np.linalg.pinv(bilinear_matrix(n_in, n_out).T)


def resize_matrix(old_hw: Tuple[int, int], new_hw: Tuple[int, int]) -> np.ndarray:
  """B [h' w', h w]: the bilinear resize of a flattened (row-major) h x w patch to h' x w'."""
  return np.kron(bilinear_matrix(old_hw[0], new_hw[0]), bilinear_matrix(old_hw[1], new_hw[1]))


def pi_resize_kernel(kernel: jax.Array, new_hw: Tuple[int, int]) -> jax.Array:
  """The patch kernel [h, w, C, D] resized to [h', w', C, D] by pseudo-inverse resize (w' =
  pinv(B^T) w for every input and output channel); the kernel itself when the size is equal."""
  (h, w), (nh, nw) = kernel.shape[:2], tuple(new_hw)
  if (h, w) == (nh, nw):
    return kernel
  ph = jnp.asarray(_pinv_t(h, nh), kernel.dtype)
  pw = jnp.asarray(_pinv_t(w, nw), kernel.dtype)
  return jnp.einsum('ai,bj,ijcd->abcd', ph, pw, kernel,
                    precision=jax.lax.Precision.HIGHEST)


def resize_posemb(posemb: jax.Array, base: Tuple[int, int], grid: Tuple[int, int],
                  method: str = 'bilinear') -> jax.Array:
  """The position embedding [1, bh*bw, D] of the underlying grid `base`, resized to `grid`
  [1, gh*gw, D] (row-major tokens) by `jax.image.resize`."""
  if tuple(base) == tuple(grid):
    return posemb
  d = posemb.shape[-1]
  pe = jnp.reshape(posemb, (1, *base, d))
  pe = jax.image.resize(pe, (1, *grid, d), method)
  return jnp.reshape(pe, (1, grid[0] * grid[1], d))


def at_patch_size(model, patch_size: int, image_size: int, flag: str = '--patch_size'):
  """The FlexiViT `model` run at `patch_size` (the same params), checked against `image_size`;
  a one-line UserError naming `flag` for a model that stores no flexible kernel or a patch size
  that does not divide the images."""
  if not getattr(model, 'flexi_patch', 0):
    raise UserError(f'{flag}={patch_size} runs a FlexiViT at another patch size, but this model '
                    f'stores its patch kernel at its own patch size (model.flexi_patch=0): leave '
                    f'{flag} out, or train with model.flexi_patch set')
  if model.posemb == 'learned' and not model.flexi_grid and patch_size != model.patch[0]:
    raise UserError(f'{flag}={patch_size} changes the token grid, but this FlexiViT\'s learned '
                    f'position embedding is stored for its own grid (model.flexi_grid=0): leave '
                    f'{flag} out, or train with model.flexi_grid set')
  if patch_size < 1 or image_size % patch_size:
    raise UserError(f'{flag}={patch_size} does not divide the {image_size} px images into '
                    f'patches: use a divisor of {image_size}')
  return model.clone(patch_size=(patch_size, patch_size))


def fixed_patch(model, params, image_size: int):
  """(model, params) of the plain ViT that the FlexiViT `model` is at its patch size on
  `image_size` px images: the kernel PI-resized and a learned position embedding resized to the
  token grid once, as the FlexiViT does at every call, so the logits are the same and the
  computation holds no resize (what an export serves). Any other model comes back as it is, and
  so does a hybrid (its token grid is the stem's)."""
  if not getattr(model, 'flexi_patch', 0) or model.resnet is not None:
    return model, params
  params = dict(params)
  params['embedding'] = {**params['embedding'], 'kernel': pi_resize_kernel(
      jnp.asarray(params['embedding']['kernel']), model.patch)}
  if model.flexi_grid and model.posemb == 'learned':
    encoder = dict(params['Transformer'])
    pe = jnp.asarray(encoder['posembed_input']['pos_embedding'])
    prefix = pe.shape[1] - model.flexi_grid ** 2  # the cls row, if the model has one
    grid = (image_size // model.patch[0], image_size // model.patch[1])
    encoder['posembed_input'] = {'pos_embedding': jnp.concatenate([pe[:, :prefix], resize_posemb(
        pe[:, prefix:], (model.flexi_grid,) * 2, grid, model.flexi_resize)], axis=1)}
    params['Transformer'] = encoder
  return model.clone(flexi_patch=0, flexi_grid=0), params


__all__ = ['at_patch_size', 'bilinear_matrix', 'fixed_patch', 'initializer', 'pi_resize_kernel',
           'resize_matrix', 'resize_posemb']
