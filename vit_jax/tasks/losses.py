"""Losses on logits and integer labels (pure functions, per-example values)."""

from vit_jax import lazy
from vit_jax.errors import UserError

jax = lazy.Module('jax')  # imported when a loss runs, not when a config is checked
jnp = lazy.Module('jax.numpy')


def one_hot(labels, num_classes: int, label_smoothing: float = 0.0):
  """One-hot targets; smoothing moves `label_smoothing` of the mass uniformly over all classes."""
  targets = jax.nn.one_hot(labels, num_classes)
  if label_smoothing:
    targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return targets


def softmax_xent(logits, targets):
  """Per-example softmax cross-entropy against (soft) targets."""
  return -jnp.sum(targets * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


def sigmoid_xent(logits, targets):
  """Per-example sum over classes of independent sigmoid cross-entropies."""
  logits = logits.astype(jnp.float32)
  log_p = jax.nn.log_sigmoid(logits)
  log_not_p = jax.nn.log_sigmoid(-logits)
  return -jnp.sum(targets * log_p + (1.0 - targets) * log_not_p, axis=-1)


LOSSES = {'softmax_xent': softmax_xent, 'sigmoid_xent': sigmoid_xent}


def get_loss(name: str):
  if name not in LOSSES:
    raise UserError(f'unknown loss {name!r}: use config.loss= one of {sorted(LOSSES)}')
  return LOSSES[name]
