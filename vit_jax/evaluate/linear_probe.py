"""Linear probe: a multinomial logistic regression on frozen features, its L2 strength chosen on a
held-out part of the training split, then refit on all of it (the protocol of the ViT paper's
Appendix D and of CLIP's linear-probe evaluation, Radford et al. 2021, Appendix A.3).

The objective is sklearn's LogisticRegression with `C = 1 / (l2 * n)`:
  mean_i cross_entropy(x_i W + b, y_i) + l2 / 2 * |W|^2     (b not penalised)
minimised by full-batch L-BFGS (optax) in float32.

  fit(x, y, num_classes, l2) -> (W, b)
  choose_l2(x, y, num_classes, grid, holdout) -> (best l2, {l2: held-out top-1})
  probe_accuracy(train_x, train_y, test_x, test_y, ...) -> {'top1', 'l2', ...}
"""

import functools
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.evaluate import options



@functools.partial(jax.jit, static_argnames=('num_classes', 'steps'))
def _fit(x, y, l2, *, num_classes: int, steps: int):
  mean, scale = jnp.mean(x, axis=0), jnp.std(x) + 1e-6
  xs = (x - mean) / scale  # conditioning only: undone on W and b below (same objective)
  one_hot = jax.nn.one_hot(y, num_classes)

  def loss(p):
    w, b = p
    logits = xs @ w + b
    ce = -jnp.mean(jnp.sum(one_hot * jax.nn.log_softmax(logits), axis=-1))
    return ce + 0.5 * l2 * jnp.sum(jnp.square(w)) / scale**2

  params = (jnp.zeros((x.shape[1], num_classes)), jnp.zeros((num_classes,)))
  opt = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(loss)

  def step(carry, _):
    p, state = carry
    value, grad = value_and_grad(p, state=state)
    updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
    return (optax.apply_updates(p, updates), state), None

  (w, b), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)[0]
  w = w / scale
  return w, b - mean @ w


def fit(x, y, num_classes: int, l2: float, steps: int = 500) -> Tuple[np.ndarray, np.ndarray]:
  """(W [d, K], b [K]) minimising the module's objective."""
  w, b = _fit(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32), jnp.float32(l2),
              num_classes=num_classes, steps=int(steps))
  return np.asarray(w), np.asarray(b)


def predict(x, w, b) -> np.ndarray:
  return np.argmax(np.asarray(x, np.float32) @ w + b, axis=1)


def holdout_split(n: int, holdout: float) -> Tuple[np.ndarray, np.ndarray]:
  """(fit indices, held-out indices): every round(1/holdout)-th example held out, so the part is
  the same on every run and spread over the split's order."""
  every = max(2, int(round(1 / holdout)))
  held = np.arange(n) % every == every - 1
  return np.flatnonzero(~held), np.flatnonzero(held)


def choose_l2(x, y, num_classes: int, grid: Sequence[float], holdout: float = 0.2,
              steps: int = 500) -> Tuple[float, Dict[float, float]]:
  """(the L2 strength of the grid with the best held-out top-1 (the first of equals), each
  strength's held-out top-1)."""
  x, y = np.asarray(x), np.asarray(y)
  fit_part, held = holdout_split(len(y), holdout)
  scores = {}
  for l2 in grid:
    w, b = fit(x[fit_part], y[fit_part], num_classes, l2, steps)
    scores[float(l2)] = float(np.mean(predict(x[held], w, b) == y[held]))
  best = max(scores, key=lambda l2: (scores[l2], -list(scores).index(l2)))
  return best, scores


def probe_accuracy(train_x, train_y, test_x, test_y, *, num_classes: int,
                   l2_grid: Sequence[float] = options.PROBE_L2_GRID, holdout: float = 0.2,
                   steps: int = 500) -> Dict[str, float]:
  """{'top1': test top-1 of the probe refit on all training features with the chosen L2,
  'l2': that strength, 'holdout_top1': its held-out top-1}."""
  options.check_probe(l2_grid, holdout, steps)
  l2, scores = choose_l2(train_x, train_y, num_classes, l2_grid, holdout, steps)
  w, b = fit(train_x, train_y, num_classes, l2, steps)
  top1 = float(np.mean(predict(test_x, w, b) == np.asarray(test_y)))
  return {'top1': top1, 'l2': l2, 'holdout_top1': scores[l2]}


__all__ = ['choose_l2', 'fit', 'holdout_split', 'predict', 'probe_accuracy']
