"""Mixup as big_vision does it (its `utils.py`, `mixup`): one lambda per step for the whole batch.

  lambda ~ Beta(alpha, alpha);  lambda = max(lambda, 1 - lambda)
  images  = lambda * images  + (1 - lambda) * roll(images, 1)     (each example with its neighbour)
  targets = lambda * targets + (1 - lambda) * roll(targets, 1)

With gradient accumulation each micro-batch is mixed within itself. `classification_objective`
is the train step's objective with mixup in front of the usual classification loss.
"""

from __future__ import annotations  # jax.Array annotations: jax loads when a step runs

from typing import Callable

from vit_jax import lazy
from vit_jax.errors import UserError
from vit_jax.tasks import losses

jax = lazy.Module('jax')  # imported when a step is traced
jnp = lazy.Module('jax.numpy')


def sample_lambda(rng: jax.Array, alpha: float) -> jax.Array:
  """max(l, 1 - l) with l ~ Beta(alpha, alpha): always in [0.5, 1]."""
  lam = jax.random.beta(rng, alpha, alpha)
  return jnp.maximum(lam, 1.0 - lam)


def mix(lam: jax.Array, images: jax.Array, targets: jax.Array):
  """Mixes every example (and its soft target) with the next one in the batch (rolled by 1)."""
  mixed = lambda x: lam.astype(x.dtype) * x + (1 - lam).astype(x.dtype) * jnp.roll(x, 1, axis=0)
  return mixed(images), mixed(targets)


def classification_objective(*, apply_fn: Callable, loss_fn: Callable, num_classes: int,
                             label_smoothing: float, alpha: float) -> Callable:
  """objective(variables, images, labels, rng) -> (mean loss, number of correct argmax
  predictions); `variables` is what `apply_fn` takes ({'params': ...})."""
  if alpha < 0:
    raise UserError(f'mixup={alpha} is negative: use the Beta alpha (e.g. 0.2), or 0 for off')

  def objective(variables, images, labels, rng):
    mix_rng, dropout_rng = jax.random.split(rng)
    targets = losses.one_hot(labels, num_classes, label_smoothing)
    images, targets = mix(sample_lambda(mix_rng, alpha), images, targets)
    logits = apply_fn(variables, images, train=True, rngs={'dropout': dropout_rng})
    loss = jnp.mean(loss_fn(logits, targets))
    return loss, jnp.sum(jnp.argmax(logits, -1) == labels)

  return objective


__all__ = ['classification_objective', 'mix', 'sample_lambda']
