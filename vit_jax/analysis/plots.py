"""Matplotlib figures for the four analyses; each function writes one PNG and returns its path.

Images are NHWC in [-1, 1] (the model's input range). matplotlib is imported lazily (Agg backend),
so importing `vit_jax.analysis` does not pull it in.
"""

import math
from typing import Optional, Sequence, Tuple

import numpy as np

DPI = 100


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _save(fig, path: str) -> str:
  fig.savefig(path, dpi=DPI)
  _pyplot().close(fig)
  return path


def _columns(n: int) -> int:
  for cols in (7, 8, 6, 5, 4):
    if n % cols == 0 and n > cols:
      return cols
  return min(n, 8)


def _as_display(x: np.ndarray) -> np.ndarray:
  """A filter or image [h, w, C] scaled to [0, 1] by its own range ([h, w] if grey)."""
  x = np.asarray(x, np.float64)
  lo, hi = x.min(), x.max()
  x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
  return x[..., 0] if x.shape[-1] == 1 else x


def plot_filters(components: np.ndarray, explained: np.ndarray, path: str, title: str) -> str:
  """Principal components [n, kh, kw, C] as small patches (RGB if C == 3, else grey)."""
  plt = _pyplot()
  n = len(components)
  cols = _columns(n)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(1.1 * cols, 1.25 * rows + 0.5), squeeze=False)
  for i, ax in enumerate(axes.flat):
    ax.axis('off')
    if i >= n:
      continue
    c = components[i]
    if c.shape[-1] in (1, 3):
      ax.imshow(_as_display(c), cmap='gray', interpolation='nearest')
    else:  # not pixel space: show the channel mean
      ax.imshow(_as_display(c.mean(axis=-1, keepdims=True)), cmap='gray',
                interpolation='nearest')
    ax.set_title(f'{i + 1}: {100 * explained[i]:.1f}%', fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return _save(fig, path)


def plot_posemb_similarity(similarity: np.ndarray, grid: Tuple[int, int], path: str,
                           title: str) -> str:
  """Grid of grids: tile (r, c) shows the similarity of position (r, c) to every position."""
  plt = _pyplot()
  gh, gw = grid
  sim = np.asarray(similarity).reshape(gh, gw, gh, gw)
  gap = 1
  mosaic = np.full((gh * (gh + gap) - gap, gw * (gw + gap) - gap), np.nan)
  for r in range(gh):
    for c in range(gw):
      y, x = r * (gh + gap), c * (gw + gap)
      mosaic[y:y + gh, x:x + gw] = sim[r, c]
  size = min(7., 1.0 + 0.8 * max(gh, gw))
  fig, ax = plt.subplots(figsize=(size + 1.2, size))
  cmap = plt.get_cmap('viridis').with_extremes(bad='white')
  im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation='nearest')
  step = max(1, gh // 8)
  ax.set_yticks([r * (gh + gap) + (gh - 1) / 2 for r in range(0, gh, step)])
  ax.set_yticklabels([str(r + 1) for r in range(0, gh, step)])
  step = max(1, gw // 8)
  ax.set_xticks([c * (gw + gap) + (gw - 1) / 2 for c in range(0, gw, step)])
  ax.set_xticklabels([str(c + 1) for c in range(0, gw, step)])
  ax.set_xlabel('Input patch column')
  ax.set_ylabel('Input patch row')
  ax.set_title(title, fontsize=9)
  fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label='Cosine similarity')
  fig.tight_layout()
  return _save(fig, path)


def plot_attention_distance(distance: np.ndarray, path: str, title: str,
                            uniform: Optional[float] = None,
                            max_distance: Optional[float] = None) -> str:
  """Scatter of mean attention distance [L, H] against depth, one colour per head."""
  plt = _pyplot()
  layers, heads = distance.shape
  fig, ax = plt.subplots(figsize=(5.5, 4))
  cmap = plt.get_cmap('tab10' if heads <= 10 else 'tab20')
  for h in range(heads):
    ax.scatter(np.arange(1, layers + 1), distance[:, h], s=18, color=cmap(h % cmap.N),
               label=f'head {h + 1}' if heads <= 16 else None)
  if uniform is not None:
    ax.axhline(uniform, color='grey', linestyle='--', linewidth=1,
               label='uniform attention')
  ax.set_xlabel('Network depth (layer)')
  ax.set_ylabel('Mean attention distance (pixels)')
  ax.set_xticks(np.arange(1, layers + 1, max(1, layers // 12)))
  ax.set_ylim(0, max_distance if max_distance else max(float(distance.max()) * 1.1, 1.))
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=6, loc='lower right', ncol=2 if heads > 6 else 1)
  fig.tight_layout()
  return _save(fig, path)


def plot_rollout(images: np.ndarray, maps: np.ndarray, path: str, title: str,
                 captions: Optional[Sequence[str]] = None, pairs_per_row: int = 4) -> str:
  """Each image next to itself overlaid with its rollout map (already at image size)."""
  plt = _pyplot()
  n = len(images)
  cols = 2 * min(pairs_per_row, n)
  rows = math.ceil(n / (cols // 2))
  fig, axes = plt.subplots(rows, cols, figsize=(1.2 * cols, 1.35 * rows + 0.4), squeeze=False)
  for ax in axes.flat:
    ax.axis('off')
  for i in range(n):
    r, c = divmod(i, cols // 2)
    image = np.clip((np.asarray(images[i], np.float64) + 1) / 2, 0, 1)
    image = image[..., 0] if image.shape[-1] == 1 else image
    heat = np.asarray(maps[i], np.float64)
    heat = heat / heat.max() if heat.max() > 0 else heat
    left, right = axes[r, 2 * c], axes[r, 2 * c + 1]
    left.imshow(image, cmap='gray', vmin=0, vmax=1)
    right.imshow(image, cmap='gray', vmin=0, vmax=1)
    right.imshow(heat, cmap='jet', alpha=0.5, vmin=0, vmax=1)
    if captions is not None:
      left.set_title(captions[i], fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return _save(fig, path)


__all__ = ['plot_filters', 'plot_posemb_similarity', 'plot_attention_distance', 'plot_rollout']
