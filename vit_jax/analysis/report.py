"""The four figures of one checkpoint, as PNGs plus the arrays behind them (.npz), and a
summary.json of the measured numbers. `python -m vit_jax analyze` calls `write_report`.

  embedding_filters    principal components of the patch-embedding filters (Figure 7 left)
  posemb_similarity    cosine similarity of the position embeddings (Figure 7 centre)
  attention_distance   mean attention distance per head and layer (Figure 7 right)
  attention_rollout    attention rollout of the classifier onto each input image (Figure 6)
"""

import json
import os
from typing import Optional, Sequence

import numpy as np

from vit_jax.analysis import attention as attention_lib
from vit_jax.analysis import embedding as embedding_lib
from vit_jax.analysis import inputs as inputs_lib
from vit_jax.analysis import plots
from vit_jax.errors import UserError
from vit_jax.formats import weights
from vit_jax.models import VisionTransformer
from vit_jax.models import posemb_resize
from vit_jax.models import resnet as resnet_lib

FIGURES = ('embedding_filters', 'posemb_similarity', 'attention_distance', 'attention_rollout')


def write_report(*, workdir: Optional[str], out: str, checkpoint: Optional[str] = None,
                 images: Sequence[str] = (), num_images: int = 16, data_dir: Optional[str] = None,
                 num_components: int = 28, image_size: Optional[int] = None,
                 model: Optional[str] = None) -> dict:
  """Writes `<out>/<figure>.{png,npz}` and `<out>/summary.json`; returns the summary. With
  `image_size`, the model runs at that size (its position embedding resized as `config.init`
  does) on images resized to it. `checkpoint` may also be an .npz params file (with `model`, its
  variant) or official weights by name (`ViT-B/16@imagenet21k`): then `images` are needed."""
  if not out:
    raise UserError('missing --out: pass --out=DIR for the figures')
  if num_images < 1:
    raise UserError(f'--num_images={num_images}: pass a positive number of eval images')
  if os.path.exists(out) and not os.path.isdir(out):
    raise UserError(f'--out={out} is a file, and the figures go into a directory: pass a new or '
                    'existing directory')
  if checkpoint and (weights.is_name(checkpoint) or str(checkpoint).endswith('.npz')):
    if workdir:
      raise UserError(f'--checkpoint={checkpoint} is a params file: drop --workdir')
    if not images:
      raise UserError(f'--checkpoint={checkpoint} comes without a dataset: pass image files '
                      '(PNG/JPEG) as arguments for the attention figures')
    model, params, spec = inputs_lib.load_params_file(checkpoint, model, image_size)
    config, source = None, checkpoint
    model_name, trained_size, at = spec.model_name, spec.image_size, checkpoint
  else:
    step_dir = inputs_lib.resolve_checkpoint(workdir, checkpoint)
    model, params, config = inputs_lib.load_model(step_dir)
    source, model_name, trained_size = str(step_dir), config.model_name, int(config.image_size)
    at = f'step {step_dir.name}'
  if not isinstance(model, VisionTransformer):
    raise UserError(f'{model_name} is a {type(model).__name__}, without the attention and '
                    'position embeddings these figures show: analyse a ViT or hybrid run')
  size = int(image_size or trained_size)
  if size != trained_size:
    params = posemb_resize.params_at_image_size(params, model, trained_size, size)
  if images:
    x = inputs_lib.load_image_files(images, size, inputs_lib.input_channels(params))
    labels, names = None, [os.path.basename(p) for p in images]
  else:
    x, labels = inputs_lib.eval_images(config, num_images, data_dir, image_size=size)
    names = None
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:  # a file on the way (--out=notes.txt/figures), no permission, ...
    raise UserError(f'cannot create --out={out} ({e.strerror or e}): pass a directory that can be '
                    'created') from None

  grid = attention_lib.token_grid(model, size)
  stride = (size / grid[0], size / grid[1])  # pixels per patch (hybrids: effective stride)
  has_cls = attention_lib.has_cls_token(model)
  what = f'{model_name} ({model.classifier}) at {at}'
  summary = {'checkpoint': source, 'model_name': model_name, 'image_size': size,
             'classifier': model.classifier, 'grid': list(grid), 'patch_pixels': list(stride),
             'num_images': int(len(x)), 'figures': {}}

  summary['figures']['embedding_filters'] = _filters(params, num_components, out, what)
  if model.posemb == 'none':
    summary['figures']['posemb_similarity'] = {'skipped': "the model has posemb='none'"}
  else:
    summary['figures']['posemb_similarity'] = _posemb(params, model, grid, has_cls, out, what)
  logits, attn = attention_lib.forward_with_attention(model, params, x)
  summary['figures']['attention_distance'] = _distance(attn, grid, stride, has_cls, out, what)
  summary['figures']['attention_rollout'] = _rollout(attn, x, logits, labels, names, grid,
                                                     has_cls, out, what)
  with open(os.path.join(out, 'summary.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  return summary


def _paths(out: str, name: str):
  return os.path.join(out, f'{name}.png'), os.path.join(out, f'{name}.npz')


def _names(png: str, npz: str) -> dict:
  return {'png': os.path.basename(png), 'npz': os.path.basename(npz)}


def _filters(params, n: int, out: str, what: str) -> dict:
  png, npz = _paths(out, 'embedding_filters')
  pca = embedding_lib.embedding_pca(params, n)
  arrays = dict(components=pca.components, explained_variance_ratio=pca.explained_variance_ratio,
                mean=pca.mean)
  kernel_shape = np.shape(params['embedding']['kernel'])
  if 'conv_root' in params:
    # A hybrid's patch embedding sees ResNet features, not pixels: draw the stem's first conv
    # (as the forward pass uses it, weight-standardised) and keep the embedding's PCA in the npz.
    kernel = np.asarray(resnet_lib.weight_standardize(np.asarray(params['conv_root']['kernel'])))
    shown = embedding_lib.kernel_pca(kernel, n)
    arrays.update(embedding_components=pca.components,
                  embedding_explained_variance_ratio=pca.explained_variance_ratio,
                  components=shown.components,
                  explained_variance_ratio=shown.explained_variance_ratio, mean=shown.mean)
    source, kernel_shape = 'conv_root', kernel.shape
  else:
    source, shown = 'embedding', pca
  np.savez(npz, source=source, **arrays)
  kh, kw, c, d = kernel_shape
  plots.plot_filters(shown.components, shown.explained_variance_ratio, png,
                     f'{what}\n{source} filters ({d} of {kh}x{kw}x{c}): first '
                     f'{len(shown.components)} principal components, % of variance')
  return {**_names(png, npz), 'source': source, 'num_components': len(shown.components),
          'explained_variance_ratio': [round(float(v), 4) for v in
                                       shown.explained_variance_ratio]}


def _posemb(params, model, grid, has_cls: bool, out: str, what: str) -> dict:
  png, npz = _paths(out, 'posemb_similarity')
  sim = embedding_lib.posemb_similarity(params, grid, has_cls, model.posemb)
  best = embedding_lib.most_similar_other(sim)
  np.savez(npz, similarity=sim, grid=np.asarray(grid), most_similar_other=best)
  interior = embedding_lib.interior_positions(grid)
  stats = {
      'neighbour8_fraction': embedding_lib.neighbour_fraction(sim, grid, 8),
      'neighbour4_fraction': embedding_lib.neighbour_fraction(sim, grid, 4),
      'interior_neighbour8_fraction': (embedding_lib.neighbour_fraction(sim, grid, 8, interior)
                                       if len(interior) else None),
  }
  plots.plot_posemb_similarity(
      sim, grid, png, f'{what}\nposition embedding similarity ({model.posemb}); most similar '
      f'other position is an 8-neighbour for {100 * stats["neighbour8_fraction"]:.0f}%')
  return {**_names(png, npz), **{k: v if v is None else round(v, 4) for k, v in stats.items()}}


def _distance(attn, grid, stride, has_cls: bool, out: str, what: str) -> dict:
  png, npz = _paths(out, 'attention_distance')
  distance = attention_lib.mean_attention_distance(attn, grid, stride, per_image=True)
  mean = distance.mean(axis=1)  # [L, H]
  uniform = attention_lib.uniform_attention_distance(grid, stride)
  farthest = float(attention_lib.patch_distances(grid, stride).max())
  cls_share = attention_lib.cls_attention_share(attn, has_cls)
  np.savez(npz, mean_distance=mean, per_image=distance, uniform_distance=uniform,
           cls_share=cls_share, grid=np.asarray(grid), patch_pixels=np.asarray(stride))
  plots.plot_attention_distance(
      mean, png, f'{what}\nmean attention distance over {distance.shape[1]} images '
      '(patch to patch, cls excluded)', uniform=uniform, max_distance=farthest)
  return {**_names(png, npz), 'uniform_distance': round(uniform, 3),
          'per_layer_min': [round(float(v), 3) for v in mean.min(axis=1)],
          'per_layer_max': [round(float(v), 3) for v in mean.max(axis=1)],
          'per_layer_cls_share': [round(float(v), 4) for v in cls_share.mean(axis=1)]}


def _rollout(attn, images, logits, labels, names, grid, has_cls: bool, out: str,
             what: str) -> dict:
  png, npz = _paths(out, 'attention_rollout')
  maps = attention_lib.attention_rollout(attn, has_cls, grid)
  big = attention_lib.upsample(maps, images.shape[1:3])
  predictions = np.argmax(logits, axis=-1)
  np.savez(npz, maps=maps, images=images, predictions=predictions,
           **({} if labels is None else {'labels': labels}))
  if labels is not None:
    captions = [f'label {l} pred {p}' for l, p in zip(labels, predictions)]
  else:
    captions = [f'{n[:12]} pred {p}' for n, p in zip(names, predictions)]
  row = 'cls row' if has_cls else 'mean row (GAP)'
  plots.plot_rollout(images, big, png, f'{what}: attention rollout ({row})', captions)
  # Share of the rollout mass inside the brightest quarter of the patches, per image.
  flat = maps.reshape(len(maps), -1)
  top = np.sort(flat, axis=1)[:, ::-1][:, :max(1, flat.shape[1] // 4)].sum(1)
  return {**_names(png, npz),
          'top_quarter_mass': round(float(np.mean(top / np.maximum(flat.sum(1), 1e-12))), 4)}


__all__ = ['write_report', 'FIGURES']
