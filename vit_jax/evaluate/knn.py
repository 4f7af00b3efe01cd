"""k-nearest-neighbour classification of frozen features, as DINO evaluates (Caron et al. 2021,
Section 4.1 and its eval_knn.py): cosine similarity, the k most similar training examples vote
for their class with weight exp(similarity / T) (or 1 each, `weighting='uniform'`).

  knn_votes(train_x, train_y, test_x, num_classes=, k=, temperature=)  -> [N, K] class votes
  knn_accuracy(...)                                                     -> {'top1', 'top5'}
"""

import functools
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.evaluate import options

_CHUNK = 1024  # test rows scored at once (bounds the [rows, train] similarity matrix)


def _normalise(x):
  x = jnp.asarray(x, jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=('num_classes', 'k', 'uniform'))
def _votes(train_x, train_y, test_x, *, num_classes: int, k: int, temperature: float,
           uniform: bool):
  similarity = test_x @ train_x.T  # both unit rows: cosine similarity
  top, index = jax.lax.top_k(similarity, k)
  weight = jnp.ones_like(top) if uniform else jnp.exp(top / temperature)
  one_hot = jax.nn.one_hot(train_y[index], num_classes, dtype=jnp.float32)
  return jnp.einsum('nk,nkc->nc', weight, one_hot)


def knn_votes(train_x, train_y, test_x, *, num_classes: int, k: int = 20,
              temperature: float = 0.07, weighting: str = 'exp') -> np.ndarray:
  """[N_test, num_classes] summed neighbour weights (the largest is the prediction)."""
  options.check_knn(k, temperature, weighting)
  train_x, train_y = _normalise(train_x), jnp.asarray(train_y, jnp.int32)
  k = min(int(k), train_x.shape[0])
  out = [np.asarray(_votes(train_x, train_y, _normalise(test_x[i:i + _CHUNK]),
                           num_classes=num_classes, k=k, temperature=float(temperature),
                           uniform=weighting == 'uniform'))
         for i in range(0, len(test_x), _CHUNK)]
  return np.concatenate(out) if out else np.zeros((0, num_classes), np.float32)


def topk_hits(scores: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
  """Whether each label is among its row's k largest scores (ties broken by lower class)."""
  order = np.argsort(-scores, axis=1, kind='stable')[:, :k]
  return np.any(order == np.asarray(labels)[:, None], axis=1)


def knn_accuracy(train_x, train_y, test_x, test_y, *, num_classes: int, k: int = 20,
                 temperature: float = 0.07, weighting: str = 'exp') -> Dict[str, float]:
  """{'top1', 'top5'} of the k-NN vote on the test features."""
  votes = knn_votes(train_x, train_y, test_x, num_classes=num_classes, k=k,
                    temperature=temperature, weighting=weighting)
  return {'top1': float(np.mean(topk_hits(votes, test_y, 1))),
          'top5': float(np.mean(topk_hits(votes, test_y, min(5, num_classes))))}


__all__ = ['knn_accuracy', 'knn_votes', 'topk_hits']
