"""What the attention does: weights of every layer, mean attention distance (the paper's Figure 7
right) and attention rollout (Abnar & Zuidema 2020; the paper's Figures 6 and 14).

Attention arrays are [L, B, H, N, N] (layers, images, heads, queries, keys), N counting the cls
token when the model has one; a list of L [B, H, N, N] arrays is accepted too.
"""

from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import layout
from vit_jax.models import vit as vit_lib
from vit_jax.models.vit import drop_registers
from vit_jax.models.vit import token_grid  # re-exported: analyses describe grids with it

Grid = Tuple[int, int]


def has_cls_token(model) -> bool:
  return vit_lib.has_cls(model.classifier)


def forward_with_attention(model, params, images, batch_size: int = 32):
  """Runs `model` (train=False) on `images`; returns (logits [B, K], attention [L, B, H, N, N]).

  N counts the cls token and the patches; a model's register tokens are left out (rows and
  columns: the patches' attention to them is not redistributed). `params` may be in either
  encoder layout; a scanned model sows its layers' weights stacked,
  which come out per layer like the unrolled model's. Always with the einsum attention kernel, the
  one that sows the weights, whatever `model.attention` the run trained with (same parameters,
  same logits up to float rounding).
  """
  model = model.clone(attention='einsum')
  params = layout.for_model(params, model)

  @jax.jit
  def run(p, x):
    logits, state = model.apply({'params': p}, x, train=False, mutable=['intermediates'])
    blocks = layout.unstack_blocks(state['intermediates'])['Transformer']
    attn = [blocks[f'encoderblock_{i}']['MultiHeadDotProductAttention_0']['attention_weights'][0]
            for i in range(model.num_layers)]
    attn = jnp.stack(attn).astype(jnp.float32)
    # Register tokens are no part of any figure: their queries and keys are dropped.
    return logits, drop_registers(model, drop_registers(model, attn, axis=3), axis=4)

  images = np.asarray(images, np.float32)
  outs = [run(params, images[i:i + batch_size]) for i in range(0, len(images), batch_size)]
  logits = np.concatenate([np.asarray(o[0]) for o in outs])
  attn = np.concatenate([np.asarray(o[1]) for o in outs], axis=1)
  return logits, attn


def attention_weights(model, params, images, batch_size: int = 32) -> np.ndarray:
  """Attention weights of every layer for `images`: [L, B, H, N, N] float32 numpy."""
  return forward_with_attention(model, params, images, batch_size)[1]


def _stack(attn) -> np.ndarray:
  attn = np.stack(attn) if isinstance(attn, (list, tuple)) else np.asarray(attn)
  if attn.ndim != 5:
    raise ValueError(f'expected attention [layers, batch, heads, N, N], got shape {attn.shape}')
  return attn.astype(np.float64)


def _cls_offset(num_tokens: int, grid: Grid, has_cls: Optional[bool]) -> int:
  patches = grid[0] * grid[1]
  if has_cls is None:
    if num_tokens not in (patches, patches + 1):
      raise ValueError(f'{num_tokens} tokens do not fit a {grid[0]}x{grid[1]} grid (+ cls)')
    has_cls = num_tokens == patches + 1
  if num_tokens != patches + int(has_cls):
    raise ValueError(f'{num_tokens} tokens != {patches} patches {"+ cls" if has_cls else ""}')
  return int(has_cls)


def _pixels(patch_pixels) -> Tuple[float, float]:
  return ((float(patch_pixels),) * 2 if np.isscalar(patch_pixels)
          else (float(patch_pixels[0]), float(patch_pixels[1])))


def patch_distances(grid: Grid, patch_pixels: Union[float, Tuple[float, float]]) -> np.ndarray:
  """Pixel distance between the centres of every pair of patches: [gh*gw, gh*gw] (row-major).

  `patch_pixels` is the patch's size in input pixels (for hybrids the effective stride,
  image size / grid size), a number or (height, width).
  """
  sy, sx = _pixels(patch_pixels)
  rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  dy = (rows[:, None] - rows[None, :]) * sy
  dx = (cols[:, None] - cols[None, :]) * sx
  return np.sqrt(dy ** 2 + dx ** 2)


def mean_attention_distance(attn, grid: Grid, patch_pixels, has_cls: Optional[bool] = None,
                            per_image: bool = False) -> np.ndarray:
  """Attention-weighted mean pixel distance between query and key patches: [L, H].

  For each layer, head, image and query patch: sum_k a[q, k] * dist(q, k), with a the
  patch-to-patch attention. The cls token is dropped from queries and keys and each query's
  remaining weights are renormalised to sum to 1, so the number measures how far a patch looks
  among the patches (the mass a patch sends to cls has no pixel position). The result is the
  mean over query patches and images ([L, B, H] if `per_image`). `has_cls=None` infers it from
  the token count.
  """
  attn = _stack(attn)
  start = _cls_offset(attn.shape[-1], grid, has_cls)
  a = attn[..., start:, start:]
  a = a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-30)
  per_query = np.einsum('lbhqk,qk->lbhq', a, patch_distances(grid, patch_pixels))
  out = per_query.mean(axis=-1)  # [L, B, H]
  return (out if per_image else out.mean(axis=1)).astype(np.float32)


def cls_attention_share(attn, has_cls: bool) -> np.ndarray:
  """Mean attention mass that patch queries give the cls token, [L, H] (the part the mean
  attention distance leaves out); zeros without a cls token."""
  attn = _stack(attn)
  if not has_cls:
    return np.zeros((attn.shape[0], attn.shape[2]), np.float32)
  return attn[..., 1:, 0].mean(axis=(1, 3)).astype(np.float32)


def uniform_attention_distance(grid: Grid, patch_pixels) -> float:
  """The mean attention distance if every patch attended uniformly to every patch (itself too)."""
  return float(patch_distances(grid, patch_pixels).mean())


def rollout_matrix(attn, head_fusion: str = 'mean') -> np.ndarray:
  """Attention rollout through all layers: [B, N, N]; row i = how token i mixes the inputs.

  Per layer: fuse the heads (mean, or max), add the identity for the residual connection,
  renormalise the rows to sum to 1 (the 0.5 A + 0.5 I of Abnar & Zuidema), then multiply the
  layers from the first up: R = A_L' ... A_1'. Each row of R sums to 1.
  """
  attn = _stack(attn)
  if head_fusion not in ('mean', 'max'):
    raise ValueError(f"head_fusion must be 'mean' or 'max', got {head_fusion!r}")
  fused = attn.mean(axis=2) if head_fusion == 'mean' else attn.max(axis=2)  # [L, B, N, N]
  eye = np.eye(attn.shape[-1])
  result = np.broadcast_to(eye, fused.shape[1:]).copy()
  for layer in fused:
    a = layer + eye
    a = a / a.sum(axis=-1, keepdims=True)
    result = a @ result
  return result.astype(np.float32)


def attention_rollout(attn, has_cls: bool, grid: Optional[Grid] = None,
                      head_fusion: str = 'mean') -> np.ndarray:
  """Rollout attention of the classifier's input onto the patches: [B, gh, gw] (or [B, P]).

  Token classifier: the cls row of the rollout; GAP: the mean of all rows (the pooled output is
  the mean of all tokens). Only the patch columns are kept (not renormalised: with a cls token
  they sum to 1 minus the share the cls token keeps of itself).
  """
  rollout = rollout_matrix(attn, head_fusion)
  row = rollout[:, 0] if has_cls else rollout.mean(axis=1)
  patches = row[:, 1:] if has_cls else row
  return patches if grid is None else patches.reshape(-1, *grid)


def upsample(maps: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
  """Bilinear upsampling of [B, gh, gw] maps to [B, *size] (e.g. the input image size)."""
  maps = jnp.asarray(maps, jnp.float32)
  return np.asarray(jax.image.resize(maps, (maps.shape[0], *size), method='bilinear'))


__all__ = ['token_grid', 'has_cls_token', 'forward_with_attention', 'attention_weights',
           'patch_distances', 'mean_attention_distance', 'cls_attention_share',
           'uniform_attention_distance',
           'rollout_matrix', 'attention_rollout', 'upsample']
