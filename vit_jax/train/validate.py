"""Value checks on a config, before anything is built: one table, one line per mistake.

Types are enforced by the locked ConfigDict; this checks ranges (a negative learning rate, a zero
batch, a dropout rate of 1.5, ...) and names the flag to fix.
"""

from typing import Any, Callable, Tuple

from vit_jax.errors import UserError

_POSITIVE = (lambda v: v > 0, 'a number > 0')
_NON_NEGATIVE = (lambda v: v >= 0, 'a number >= 0')
_AT_LEAST_ONE = (lambda v: v >= 1, 'an integer >= 1')
_FRACTION = (lambda v: 0 <= v < 1, 'in [0, 1)')

# key -> (predicate, what the value must be); a key missing from a config is not checked.
RULES: Tuple[Tuple[str, Tuple[Callable[[Any], bool], str]], ...] = (
    ('batch_size', _AT_LEAST_ONE),
    ('eval_batch_size', _AT_LEAST_ONE),
    ('accum_steps', _AT_LEAST_ONE),
    ('image_size', _AT_LEAST_ONE),
    ('total_steps', _AT_LEAST_ONE),
    ('total_epochs', _POSITIVE),
    ('warmup_steps', _NON_NEGATIVE),
    ('lr', _POSITIVE),
    ('lr_end', _NON_NEGATIVE),
    ('b1', _FRACTION),
    ('b2', _FRACTION),
    ('momentum', _FRACTION),
    ('weight_decay', _NON_NEGATIVE),
    ('grad_clip_norm', _NON_NEGATIVE),
    ('label_smoothing', _FRACTION),
    ('model.dropout_rate', _FRACTION),
    ('model.attention_dropout_rate', _FRACTION),
    ('model.stochastic_depth', _FRACTION),
    ('log_every', _AT_LEAST_ONE),
    ('eval_every', _AT_LEAST_ONE),
    ('checkpoint_every', _AT_LEAST_ONE),
    ('keep_checkpoints', _AT_LEAST_ONE),
    ('max_nonfinite_steps', _NON_NEGATIVE),
    ('shuffle_buffer', _AT_LEAST_ONE),
    ('prefetch', _AT_LEAST_ONE),
)


def _lookup(config, key: str):
  node = config
  for part in key.split('.'):
    if part not in node:
      return None
    node = node[part]
  return node


def check_values(config) -> None:
  """Raises a UserError naming the first key whose value is out of range."""
  for key, (ok, what) in RULES:
    value = _lookup(config, key)
    if value is not None and not ok(value):
      raise UserError(f'--config.{key}={value!r} is out of range: it must be {what}')


__all__ = ['check_values', 'RULES']
