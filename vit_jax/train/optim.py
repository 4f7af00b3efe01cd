"""Learning-rate schedules and optimizers (optax), with the paper's weight-decay convention.

JAX and optax load when a schedule or optimizer is made: the config's validation checks the
warmup (`check_warmup`) before they are imported.
"""

from __future__ import annotations  # optax annotations: optax loads when an optimizer is made

import math

import numpy as np

from vit_jax import lazy
from vit_jax.errors import UserError
from vit_jax.train.choices import DECAY_TYPES, OPTIMIZERS, WEIGHT_DECAY_MASKS

jax = lazy.Module('jax')
jnp = lazy.Module('jax.numpy')
optax = lazy.Module('optax')
polyak = lazy.Module('vit_jax.train.polyak')


# The run's values the compiled train step takes as arguments instead of constants: runs that
# differ only in these (a sweep over the learning rate, the weight decay or the schedule's length)
# are one program, compiled once and then read from the persistent compilation cache. Whether a
# value is zero (no warmup, no weight decay) still shapes the program.
HYPERPARAMETERS = ('lr', 'lr_end', 'warmup_steps', 'total_steps', 'weight_decay')


def hyperparameters(config, total_steps: int) -> dict:
  """`HYPERPARAMETERS` of `config` as float32 scalars (step counts are exact up to 2**24)."""
  return {k: np.float32(total_steps if k == 'total_steps' else config[k]) for k in HYPERPARAMETERS}


def make_schedule(*, lr: float, total_steps: int, warmup_steps: int, decay_type: str,
                  lr_end: float = 0.0):
  """lr(step) = lr * min(1, step/warmup) * decay(progress), progress over the post-warmup steps.

  As the original code: step 0 gives lr 0 (optax evaluates the schedule at count 0).
  """
  check_warmup(warmup_steps, total_steps)
  return schedule_of(decay_type, dict(lr=lr, lr_end=lr_end, warmup_steps=warmup_steps,
                                      total_steps=total_steps))


def check_warmup(warmup_steps: int, total_steps: int) -> None:
  if warmup_steps >= total_steps and total_steps > 0 and warmup_steps > 0:
    raise UserError(f'warmup_steps={warmup_steps} is not below total_steps={total_steps}: '
                    'lower config.warmup_steps')


def schedule_of(decay_type: str, hyper: dict):
  """`make_schedule`'s schedule from `hyper` (`hyperparameters`), whose values may be traced."""
  if decay_type not in DECAY_TYPES:
    raise UserError(f'unknown decay_type {decay_type!r}: use config.decay_type=linear or cosine')
  lr, lr_end = hyper['lr'], hyper['lr_end']
  warmup, total = hyper['warmup_steps'], hyper['total_steps']

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.where(warmup > 0, jnp.minimum(1.0, step / jnp.maximum(warmup, 1)), 1.0)
    progress = jnp.clip((step - warmup) / jnp.maximum(1, total - warmup), 0.0, 1.0)
    if decay_type == 'linear':
      decay = 1.0 - progress
    else:
      decay = 0.5 * (1.0 + jnp.cos(math.pi * progress))
    return warm * (lr_end + (lr - lr_end) * decay)

  return schedule


def from_hyperparameters(config, hyper: dict):
  """(the optimizer, its schedule) of `config` with `hyper`'s values, which may be traced: the
  train step builds them from its arguments."""
  schedule = schedule_of(config.decay_type, hyper)
  return make_optimizer(config, schedule, weight_decay=hyper['weight_decay']), schedule


def _kernel_mask(params):
  def is_kernel(path, _):
    return getattr(path[-1], 'key', None) == 'kernel'
  return jax.tree_util.tree_map_with_path(is_kernel, params)


def make_optimizer(config, schedule, weight_decay=None) -> optax.GradientTransformation:
  """clip -> (adam | sgd momentum) -> decoupled weight decay scaled by lr -> -lr [-> Polyak].

  weight_decay follows the ViT paper: the per-step decay is lr_t * weight_decay * param (so
  wd=0.1 with peak lr 1e-3 equals big_vision's wd=1e-4). `weight_decay` (default
  `config.weight_decay`) may be traced; whether `config.weight_decay` is zero decides the chain.
  """
  mu_dtype = jnp.dtype(config.mu_dtype)
  parts = []
  if config.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.optimizer == 'adam':
    parts.append(optax.scale_by_adam(b1=config.b1, b2=config.b2, mu_dtype=mu_dtype))
  elif config.optimizer == 'sgd':
    parts.append(optax.trace(decay=config.momentum, accumulator_dtype=mu_dtype))
  else:
    raise UserError(f'unknown optimizer {config.optimizer!r}: use config.optimizer=adam or sgd')
  if config.weight_decay:
    if config.weight_decay_mask not in WEIGHT_DECAY_MASKS:
      raise UserError(f'unknown weight_decay_mask {config.weight_decay_mask!r}: use kernels or all')
    mask = _kernel_mask if config.weight_decay_mask == 'kernels' else None
    decay = config.weight_decay if weight_decay is None else weight_decay
    parts.append(optax.add_decayed_weights(decay, mask=mask))
  parts.append(optax.scale_by_learning_rate(schedule))
  if config.polyak_decay:
    parts.append(polyak.ema_of_params(config.polyak_decay))  # last: it sees the final updates
  return optax.chain(*parts)
