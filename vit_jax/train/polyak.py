"""Polyak averaging of the parameters (ViT paper, Table 2: factor 0.9999 for the ImageNet headline
numbers).

An exponential moving average, updated after every step from the new parameters,
  avg_t = decay * avg_{t-1} + (1 - decay) * params_t,  avg_0 = params_0,
kept as the last element of the optimizer chain (`ema_of_params`), so it lives in the optimizer
state: it is sharded, checkpointed and restored with it, and the train step stays unchanged.
Evaluation (and the few-shot evaluator) reads `eval_params(state)`, the average when there is one.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from vit_jax.errors import UserError


class PolyakState(NamedTuple):
  average: Any  # same tree as the params, float32


def ema_of_params(decay: float) -> optax.GradientTransformation:
  """Leaves the updates unchanged; tracks the average of params + updates (the new params).

  Must be the last transformation of the chain, so that its updates are the final ones.
  """
  if not 0.0 < decay < 1.0:
    raise UserError(f'polyak_decay={decay} is not in (0, 1): use e.g. 0.9999, or 0 for no '
                    f'averaging')

  def init_fn(params):
    return PolyakState(average=jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('ema_of_params needs the params: call tx.update(grads, state, params)')
    average = jax.tree.map(
        lambda a, p, u: decay * a + (1.0 - decay) * (p + u).astype(jnp.float32),
        state.average, params, updates)
    return updates, PolyakState(average=average)

  return optax.GradientTransformation(init_fn, update_fn)


def find_average(opt_state):
  """The averaged params inside an optimizer state, or None without Polyak averaging."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, PolyakState))
           if isinstance(s, PolyakState)]
  return found[0].average if found else None


def eval_params(state):
  """What to evaluate: the Polyak average if the optimizer keeps one, else the params."""
  average = find_average(state.opt_state)
  if average is None:
    return state.params
  return jax.tree.map(lambda a, p: a.astype(p.dtype), average, state.params)


__all__ = ['PolyakState', 'ema_of_params', 'eval_params', 'find_average']
