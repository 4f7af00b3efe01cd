"""What the input layers learned: principal components of the patch-embedding filters and the
cosine similarity of the position embeddings (the paper's Figure 7, left and centre).

All functions take plain arrays (or the model's param tree) and return numpy arrays.
"""

from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np

from vit_jax.models.vit import sincos2d_posemb


class PCA(NamedTuple):
  """Principal components of a conv kernel's filters.

  components: [n, kh, kw, C]; flattened to [n, kh*kw*C] the rows are orthonormal.
  explained_variance_ratio: [n], each component's share of the filters' total variance.
  mean: [kh, kw, C], the mean filter (subtracted before the decomposition).
  """
  components: np.ndarray
  explained_variance_ratio: np.ndarray
  mean: np.ndarray


def kernel_pca(kernel, n: int = 28) -> PCA:
  """PCA of a [kh, kw, C, D] conv kernel, treating its D output filters as samples in kh*kw*C.

  Returns min(n, D, kh*kw*C) components: a grayscale 4x4 patch embedding has only 16 pixel
  dimensions, so it has at most 16 components however many are asked for.
  """
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim != 4:
    raise ValueError(f'expected a [kh, kw, C, D] conv kernel, got shape {kernel.shape}')
  kh, kw, c, d = kernel.shape
  filters = kernel.reshape(kh * kw * c, d).T  # [D, kh*kw*C]: one row per output filter
  mean = filters.mean(axis=0)
  _, s, vt = np.linalg.svd(filters - mean, full_matrices=False)
  n = min(int(n), vt.shape[0])
  variance = s ** 2
  total = variance.sum()
  ratio = variance[:n] / total if total > 0 else np.zeros(n)
  return PCA(components=vt[:n].reshape(n, kh, kw, c).astype(np.float32),
             explained_variance_ratio=ratio.astype(np.float32),
             mean=mean.reshape(kh, kw, c).astype(np.float32))


def embedding_pca(params, n: int = 28) -> PCA:
  """The first `n` principal components of the patch-embedding kernel `embedding/kernel`."""
  return kernel_pca(params['embedding']['kernel'], n)


def position_embeddings(params_or_posemb, grid: Tuple[int, int], has_cls: bool,
                        posemb: str = 'learned') -> np.ndarray:
  """The [gh*gw, D] position embeddings of the patch tokens (the cls slot dropped).

  `params_or_posemb` is the model's param tree or an embedding array ([N, D] or [1, N, D], N
  counting the cls slot if `has_cls`). posemb='sincos2d' ignores it and returns the fixed table.
  """
  gh, gw = grid
  if posemb == 'sincos2d':
    width = np.asarray(params_or_posemb['embedding']['bias']).shape[-1]
    return sincos2d_posemb(gh, gw, width)
  if posemb != 'learned':
    raise ValueError(f"posemb {posemb!r} has no position embeddings to compare")
  if hasattr(params_or_posemb, 'keys'):
    pe = params_or_posemb['Transformer']['posembed_input']['pos_embedding']
  else:
    pe = params_or_posemb
  pe = np.asarray(pe, np.float32)
  pe = pe.reshape(pe.shape[-2], pe.shape[-1])
  start = 1 if has_cls else 0
  if pe.shape[0] - start != gh * gw:
    raise ValueError(f'{pe.shape[0]} position embeddings do not fit a {gh}x{gw} grid '
                     f'{"plus cls" if has_cls else "without cls"}')
  return pe[start:]


def posemb_similarity(params_or_posemb, grid: Tuple[int, int], has_cls: bool,
                      posemb: str = 'learned') -> np.ndarray:
  """Cosine similarity of every patch position's embedding to every other: [gh*gw, gh*gw].

  Row i (row-major position (i // gw, i % gw)) reshaped to [gh, gw] is one tile of Figure 7
  centre. The matrix is symmetric with ones on the diagonal; the cls embedding is excluded.
  """
  pe = position_embeddings(params_or_posemb, grid, has_cls, posemb).astype(np.float64)
  norms = np.linalg.norm(pe, axis=1, keepdims=True)
  unit = pe / np.maximum(norms, 1e-12)
  sim = np.clip(unit @ unit.T, -1., 1.)
  return sim.astype(np.float32)


def most_similar_other(similarity: np.ndarray) -> np.ndarray:
  """For each position, the index of the most similar *other* position: [P]."""
  sim = np.array(similarity, np.float64)
  np.fill_diagonal(sim, -np.inf)
  return sim.argmax(axis=1)


def is_grid_neighbour(i, j, grid: Tuple[int, int], connectivity: int = 8):
  """Whether row-major positions i and j of the grid are 4- or 8-neighbours (never i itself)."""
  if connectivity not in (4, 8):
    raise ValueError(f'connectivity must be 4 or 8, got {connectivity}')
  gw = grid[1]
  dy = np.abs(np.asarray(i) // gw - np.asarray(j) // gw)
  dx = np.abs(np.asarray(i) % gw - np.asarray(j) % gw)
  near = (dy + dx == 1) if connectivity == 4 else (np.maximum(dy, dx) == 1)
  return near


def neighbour_fraction(similarity: np.ndarray, grid: Tuple[int, int], connectivity: int = 8,
                       positions: Optional[Sequence[int]] = None) -> float:
  """Fraction of `positions` (default: all) whose most similar other position is a neighbour."""
  best = most_similar_other(similarity)
  positions = np.arange(len(best)) if positions is None else np.asarray(positions)
  return float(np.mean(is_grid_neighbour(positions, best[positions], grid, connectivity)))


def interior_positions(grid: Tuple[int, int]) -> np.ndarray:
  """Row-major indices of the positions not on the grid's border (they have all 8 neighbours)."""
  gh, gw = grid
  rows, cols = np.mgrid[1:gh - 1, 1:gw - 1]
  return (rows * gw + cols).reshape(-1)



__all__ = ['PCA', 'kernel_pca', 'embedding_pca', 'position_embeddings', 'posemb_similarity',
           'most_similar_other', 'is_grid_neighbour', 'neighbour_fraction', 'interior_positions']
