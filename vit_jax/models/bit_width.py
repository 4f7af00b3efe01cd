"""BiT's root width, without Flax: the variant table checks a name's width factor with it before
the model (vit_jax/models/bit.py) is imported."""

from vit_jax.errors import UserError

GN_GROUPS = 32  # groups of BiT's GroupNorm: the root conv's 64 x width channels split into them


def root_width(width_factor: float) -> int:
  """Channels after BiT's root conv, 64 x width_factor; a UserError unless GroupNorm fits."""
  width = 64 * width_factor
  if width <= 0 or width != int(width) or int(width) % GN_GROUPS:
    raise UserError(f'BiT width factor {width_factor} gives {width} root channels, which do not '
                    f'split into {GN_GROUPS} GroupNorm groups: use a multiple of 0.5 (x0.5, x1, '
                    'x1.5, x2, ...)')
  return int(width)


__all__ = ['GN_GROUPS', 'root_width']
