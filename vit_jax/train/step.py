"""The pure train and eval steps. No I/O, no globals: jitted once by the loop.

`train_step(state, batch, rng) -> (state, metrics)`; the batch is the global batch (images
[B,H,W,C] in [-1,1], int labels [B]). Gradient accumulation splits it into `accum_steps`
micro-batches, each a strided slice so that every device keeps working on its own rows.
"""

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from vit_jax.train import losses


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def _l2(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def make_train_step(*, apply_fn: Callable, tx: optax.GradientTransformation, loss_fn: Callable,
                    num_classes: int, label_smoothing: float, accum_steps: int,
                    schedule: Callable, objective: Callable | None = None):
  """Returns the pure train step for this model, optimizer and loss.

  `objective(params, images, labels, rng) -> (mean loss, number correct)` replaces the default
  classification objective (mixup: train/mixup.py; masked patch prediction: train/mpp.py).
  """

  def loss_and_logits(params, images, labels, rng):
    logits = apply_fn({'params': params}, images, train=True, rngs={'dropout': rng})
    targets = losses.one_hot(labels, num_classes, label_smoothing)
    return jnp.mean(loss_fn(logits, targets)), logits

  def correct(logits, labels):
    return jnp.sum(jnp.argmax(logits, -1) == labels)

  def classification(params, images, labels, rng):
    loss, logits = loss_and_logits(params, images, labels, rng)
    return loss, correct(logits, labels)

  grad_fn = jax.value_and_grad(objective or classification, has_aux=True)

  def train_step(state: TrainState, batch, rng):
    rng = jax.random.fold_in(rng, state.step)
    images, labels = batch['image'], batch['label']
    if accum_steps == 1:
      (loss, n_correct), grads = grad_fn(state.params, images, labels, rng)
    else:
      def micro(x):  # [B, ...] -> [accum, B/accum, ...]; micro-batch i = rows i, i+a, i+2a, ...
        return jnp.swapaxes(x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:]), 0, 1)

      def body(carry, xs):
        grads, loss, n_correct = carry
        i, im, lab = xs
        (l, c), g = grad_fn(state.params, im, lab, jax.random.fold_in(rng, i))
        grads = jax.tree.map(jnp.add, grads, g)
        return (grads, loss + l, n_correct + c), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (grads, loss, n_correct), _ = jax.lax.scan(
          body, (zeros, 0.0, 0), (jnp.arange(accum_steps), micro(images), micro(labels)))
      grads = jax.tree.map(lambda g: g / accum_steps, grads)
      loss = loss / accum_steps
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        'loss': loss,
        'accuracy': n_correct / labels.shape[0],
        'lr': schedule(state.step),
        'grad_norm': _l2(grads),
        'param_norm': _l2(params),
        'update_norm': _l2(updates),
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


def make_eval_step(*, apply_fn: Callable, loss_fn: Callable, num_classes: int):
  """Returns eval_step(params, batch) -> sums of correct, loss and count over unmasked examples."""

  def eval_step(params, batch):
    logits = apply_fn({'params': params}, batch['image'], train=False)
    mask = batch['mask'].astype(jnp.float32)
    targets = losses.one_hot(batch['label'], num_classes)
    hit = (jnp.argmax(logits, -1) == batch['label']).astype(jnp.float32)
    return {'correct': jnp.sum(hit * mask), 'loss': jnp.sum(loss_fn(logits, targets) * mask),
            'count': jnp.sum(mask)}

  return eval_step
