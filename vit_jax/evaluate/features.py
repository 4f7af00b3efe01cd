"""Frozen features of a model, the one path every representation evaluator reads them through
(few-shot, k-NN, linear probe), and their cache in a run's workdir.

Features are the pre-logits: what the classifier head sees (the class token or the pooled
patch tokens after the encoder norm, and after the pre_logits layer if the model has one), never
the register tokens or any other token. Batches are sharded over the mesh's data axes; the
features of all processes are gathered in the batches' order and the padding rows dropped.

`FeatureCache(directory, identity)` keeps them in `<directory>/<key>/`, the key a digest of the
checkpoint's step and content, the dataset's identity, the split, the preprocessing and the
batch size, so a changed checkpoint or dataset is other data, never a hit. Each chunk of batches
is written as it is done (a temporary file renamed), so an extraction stopped by a signal
resumes at its first missing chunk.
"""

import hashlib
import json
import os
from typing import Callable, Iterable, Optional, Tuple

import jax
import numpy as np
from jax.experimental import multihost_utils

from vit_jax import parallel
from vit_jax.errors import UserError
from vit_jax.parallel import sharding

CHUNK_BATCHES = 8  # batches per cache file


def feature_fn(model) -> Callable:
  """f(params, images) -> the pre-logit features [B, D] of `model`."""
  if model.classifier == 'unpooled':
    raise UserError('representation evaluators need pooled features: use a model with '
                    'classifier token or gap')

  def features(params, images):
    _, state = model.apply({'params': params}, images, train=False, mutable=['intermediates'])
    return state['intermediates']['features'][0]

  return features


class Extractor:
  """`extractor(params, batches) -> (features [N, D] float32, labels [N])` on host, in order."""

  def __init__(self, model, mesh, param_shardings):
    self.mesh = mesh
    self._fn = jax.jit(feature_fn(model),
                       in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
                       out_shardings=sharding.batch_sharding(mesh))

  def batch(self, params, batch) -> Tuple[np.ndarray, np.ndarray]:
    """The features and labels of one host-local batch's real rows (all processes' rows)."""
    batch = parallel.shard_batch(batch, self.mesh)
    x, y, mask = multihost_utils.process_allgather(
        (self._fn(params, batch['image']), batch['label'], batch['mask']), tiled=True)
    keep = np.asarray(mask) > 0
    return np.asarray(x, np.float32)[keep], np.asarray(y)[keep]

  def __call__(self, params, batches: Iterable[dict], cache: Optional['FeatureCache'] = None):
    if cache is not None:
      return cache.extract(self, params, batches)
    parts = [self.batch(params, b) for b in batches]
    return _joined(parts)


def _joined(parts):
  if not parts:
    return np.zeros((0, 0), np.float32), np.zeros((0,), np.int64)
  return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def dataset_identity(info) -> dict:
  """A dataset's identity as the cache key and the results table record it: its name, and its
  class names, split sizes and content fingerprint where it has one (`data.identity`; an
  embedded dataset, which the installed package carries, by its name and sizes)."""
  from vit_jax.data import identity  # pylint: disable=g-import-not-at-top
  found = identity.identify(info)
  if found is None:
    return {'name': info.name, 'embedded': True, 'num_classes': int(info.num_classes),
            'split_sizes': {str(k): int(v) for k, v in sorted(info.split_sizes.items())}}
  return {'name': info.name, **found}


def digest(value) -> str:
  """A short stable digest of a JSON-able value."""
  return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class FeatureCache:
  """Features of one checkpoint (`identity`: its step and content) under `directory`."""

  def __init__(self, directory: str, identity: dict, chunk_batches: int = CHUNK_BATCHES):
    self.directory, self.identity, self.chunk_batches = directory, identity, chunk_batches
    self.key = None

  def for_data(self, dataset_identity: dict, split: str, pp: str,
               batch_size: int) -> 'FeatureCache':
    """This cache narrowed to one dataset split under one preprocessing (its op string `pp`),
    read in batches of `batch_size` (which sets the chunks' bounds)."""
    out = FeatureCache(self.directory, self.identity, self.chunk_batches)
    out.key = digest({'checkpoint': self.identity, 'dataset': dataset_identity, 'split': split,
                      'pp': pp, 'batch_size': int(batch_size), 'chunk': self.chunk_batches})
    return out

  @property
  def path(self) -> str:
    return os.path.join(self.directory, self.key)

  def _chunk(self, index: int) -> str:
    return os.path.join(self.path, f'chunk_{index:05d}.npz')

  def extract(self, extractor: Extractor, params, batches: Iterable[dict]):
    """The features of `batches`, read from the chunks already written, computed (and written)
    for the others."""
    if self.key is None:
      raise ValueError('FeatureCache.for_data first')
    writer = jax.process_index() == 0
    if writer:
      os.makedirs(self.path, exist_ok=True)
    parts, pending, index = [], [], 0
    for batch in batches:
      if os.path.exists(self._chunk(index)):
        pending.append(None)  # read below, with the chunk
      else:
        pending.append(extractor.batch(params, batch))
      if len(pending) == self.chunk_batches:
        parts.append(self._settle(index, pending, writer))
        pending, index = [], index + 1
    if pending:
      parts.append(self._settle(index, pending, writer))
    return _joined(parts)

  def _settle(self, index: int, pending: list, writer: bool):
    path = self._chunk(index)
    if os.path.exists(path):
      with np.load(path) as stored:
        return stored['x'], stored['y']
    x, y = _joined(pending)
    if writer:
      tmp = f'{path}.tmp.npz'
      np.savez(tmp, x=x, y=y)
      os.replace(tmp, path)
    return x, y


__all__ = ['CHUNK_BATCHES', 'Extractor', 'FeatureCache', 'dataset_identity', 'digest',
           'feature_fn']
