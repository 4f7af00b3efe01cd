"""Learning-rate schedules and optimizers (optax), with the paper's weight-decay convention."""

import math

import jax
import jax.numpy as jnp
import optax

from vit_jax.errors import UserError
from vit_jax.train import polyak

OPTIMIZERS = ('adam', 'sgd')
DECAY_TYPES = ('linear', 'cosine')
WEIGHT_DECAY_MASKS = ('kernels', 'all')


def make_schedule(*, lr: float, total_steps: int, warmup_steps: int, decay_type: str,
                  lr_end: float = 0.0):
  """lr(step) = lr * min(1, step/warmup) * decay(progress), progress over the post-warmup steps.

  As the original code: step 0 gives lr 0 (optax evaluates the schedule at count 0).
  """
  if decay_type not in DECAY_TYPES:
    raise UserError(f'unknown decay_type {decay_type!r}: use config.decay_type=linear or cosine')
  if warmup_steps >= total_steps and total_steps > 0 and warmup_steps > 0:
    raise UserError(f'warmup_steps={warmup_steps} is not below total_steps={total_steps}: '
                    'lower config.warmup_steps')

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.minimum(1.0, step / warmup_steps) if warmup_steps else 1.0
    progress = jnp.clip((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
    if decay_type == 'linear':
      decay = 1.0 - progress
    else:
      decay = 0.5 * (1.0 + jnp.cos(math.pi * progress))
    return warm * (lr_end + (lr - lr_end) * decay)

  return schedule


def _kernel_mask(params):
  def is_kernel(path, _):
    return getattr(path[-1], 'key', None) == 'kernel'
  return jax.tree_util.tree_map_with_path(is_kernel, params)


def make_optimizer(config, schedule) -> optax.GradientTransformation:
  """clip -> (adam | sgd momentum) -> decoupled weight decay scaled by lr -> -lr [-> Polyak].

  weight_decay follows the ViT paper: the per-step decay is lr_t * weight_decay * param (so
  wd=0.1 with peak lr 1e-3 equals big_vision's wd=1e-4).
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
    parts.append(optax.add_decayed_weights(config.weight_decay, mask=mask))
  parts.append(optax.scale_by_learning_rate(schedule))
  if config.polyak_decay:
    parts.append(polyak.ema_of_params(config.polyak_decay))  # last: it sees the final updates
  return optax.chain(*parts)
