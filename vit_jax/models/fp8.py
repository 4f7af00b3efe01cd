"""fp8 matmuls with delayed scaling for the encoder's dense layers (`model.fp8=True`).

`Fp8Dot` is a `dot_general_cls` for flax's `Dense`/`DenseGeneral`: it multiplies the input and the
kernel in float8_e4m3fn and the output gradient in float8_e5m2 (Hopper's two fp8 formats, the
usual split: more mantissa forward, more range backward), each scaled by a factor taken from the
largest magnitude seen over the last `AMAX_HISTORY` steps (delayed scaling, as NVIDIA's
Transformer Engine). The arithmetic is flax's `fp8_ops.fp8_scaled_dot_general`; on an NVIDIA GPU
of compute capability >= 8.9 XLA turns its quantise -> dot -> dequantise pattern into one cuBLASLt
fp8 GEMM. XLA:CPU computes the same function with the fp8 operands widened to float32, which is
what lets the tests check the numerics on any machine.

State: per dense layer three scales [1] and three amax histories [AMAX_HISTORY] (input, kernel,
output gradient) in the `COLLECTION` variable collection, not in 'params'. The train step passes
them to `apply` next to the params and differentiates with respect to them: their "gradient" is
their next value (flax's overwrite-with-gradient convention), which the step stores in place of
the old one; the optimizer never sees them (vit_jax/train/step.py).

Without that collection (evaluation, export, serving, a model built from a file) the same layers
multiply in the model's `dtype` with the same parameters: the scales are training state, and the
parameters alone are the model.
"""

from typing import Any, Optional

import flax.linen as nn
from flax.linen import fp8_ops
import jax
import jax.numpy as jnp
from jax import lax

# flax's name for variables that the gradient overwrites (the same collection its fp8 ops use).
COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT
# Steps of amax history the scale is taken from (Transformer Engine's and flax's default).
AMAX_HISTORY = 1024
# The variables of one dense layer: (name, shape, initial value).
STATE = (
    ('input_scale', (1,), 1.), ('kernel_scale', (1,), 1.), ('output_grad_scale', (1,), 1.),
    ('input_amax_history', (AMAX_HISTORY,), 0.), ('kernel_amax_history', (AMAX_HISTORY,), 0.),
    ('output_grad_amax_history', (AMAX_HISTORY,), 0.),
)


class Fp8Dot(nn.Module):
  """`lax.dot_general` in fp8 with delayed scaling (flax's `Fp8DirectDotGeneralOp`, with its state
  declared in `__call__` so that a model applied without the state runs the plain dot)."""

  @nn.compact
  def __call__(self, lhs: jax.Array, rhs: jax.Array, dimension_numbers,
               precision: Optional[Any] = None,
               preferred_element_type: Optional[Any] = None) -> jax.Array:
    if not (self.is_initializing() or self.has_variable(COLLECTION, STATE[0][0])):
      return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type)
    state = {name: self.variable(COLLECTION, name,
                                 lambda s=shape, v=value: jnp.full(s, v, jnp.float32)).value
             for name, shape, value in STATE}
    compute = rhs.dtype  # the layer's dtype (Dense promotes the kernel to it)
    return fp8_ops.fp8_scaled_dot_general(
        lhs.astype(compute), rhs, dimension_numbers, preferred_element_type=compute,
        lhs_scale=state['input_scale'], rhs_scale=state['kernel_scale'],
        grad_scale=state['output_grad_scale'], lhs_amax_history=state['input_amax_history'],
        rhs_amax_history=state['kernel_amax_history'],
        grad_amax_history=state['output_grad_amax_history'], quantize_compute_type=compute)


def dot_general_cls(fp8: bool):
  """The `dot_general_cls` argument of a dense layer: `Fp8Dot` with fp8, else None (flax's)."""
  return Fp8Dot if fp8 else None


def split(variables) -> tuple:
  """(params, fp8 state or {}) of a flax variables dict from `init`."""
  return variables['params'], dict(variables.get(COLLECTION, {}))


def variables(params, state) -> dict:
  """The variables `apply` takes: the params, and the fp8 state where there is one."""
  return {'params': params, COLLECTION: state} if state else {'params': params}


__all__ = ['COLLECTION', 'AMAX_HISTORY', 'STATE', 'Fp8Dot', 'dot_general_cls', 'split',
           'variables']
