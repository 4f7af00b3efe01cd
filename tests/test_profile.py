"""The kernel profile: FLOPs read from compiled HLO against closed forms, op names to components,
trace events to per-step rows."""

import jax
import jax.numpy as jnp
import pytest

from vit_jax.benchmarking import profile


def _entry_flops(fn, *args) -> float:
  text = jax.jit(fn).lower(*args).compile().as_text()
  instrs, comps = profile.parse_hlo(text), profile.computations(text)
  entry = [name for name in comps if name.startswith('main')]
  assert len(entry) == 1, list(comps)
  return sum(profile.kernel_flops(name, instrs, comps) for name in comps[entry[0]])


def test_matmul_flops_inside_a_fusion():
  a, b = jnp.ones((64, 96)), jnp.ones((96, 40))
  assert _entry_flops(lambda a, b: jnp.tanh(a @ b) + 1., a, b) == 2 * 64 * 96 * 40


def test_convolution_flops_forward_and_backward():
  x, k = jnp.ones((2, 32, 32, 3)), jnp.ones((4, 4, 3, 8))
  conv = lambda x, k: jax.lax.conv_general_dilated(
      x, k, (4, 4), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  forward = 2 * (2 * 8 * 8 * 8) * (4 * 4 * 3)  # 2 x outputs x (kernel window x input channels)
  assert _entry_flops(conv, x, k) == forward
  # The kernel gradient is one more convolution of the same size.
  grad = jax.grad(lambda x, k: jnp.sum(conv(x, k) ** 2), argnums=1)
  assert _entry_flops(grad, x, k) == 2 * forward


@pytest.mark.parametrize('op_name,expected', [
    ('jit(f)/VisionTransformer/Transformer/encoderblock_3/MultiHeadDotProductAttention_0/query/'
     'dot_general', ('forward', 'q/k/v projections')),
    ('jit(f)/transpose(jvp(VisionTransformer))/Transformer/encoderblock_0/'
     'MultiHeadDotProductAttention_0/bhqk,bhkd->bhqd/dot_general',
     ('backward', 'attention core (QK, softmax, AV)')),
    ('jit(f)/jvp(VisionTransformer)/Transformer/encoderblock_11/MlpBlock_0/Dense_1/dot_general',
     ('forward', 'MLP Dense_1')),
    ('jit(f)/jvp(VisionTransformer)/Transformer/encoderblock_1/MlpBlock_0/tanh',
     ('forward', 'GELU')),
    ('jit(f)/transpose(jvp(VisionTransformer))/Transformer/encoder_norm/mul',
     ('backward', 'LayerNorm')),
    ('jit(f)/jvp(VisionTransformer)/embedding/conv_general_dilated',
     ('forward', 'patch embedding')),
    ('jit(f)/mul', ('optimizer, loss, other', '-')),
])
def test_op_names_map_to_phase_and_component(op_name, expected):
  assert profile.classify(op_name) == expected


def test_events_sum_per_component_and_step():
  text = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(
      jnp.ones((8, 16)), jnp.ones((16, 4))).compile().as_text()
  instrs = profile.parse_hlo(text)
  kernels = [name for name, ins in instrs.items() if ins.opcode == 'fusion']
  assert kernels
  events = [{'ph': 'X', 'name': kernels[0], 'dur': 3000.}, {'ph': 'X', 'name': kernels[0],
                                                            'dur': 1000.},
            {'ph': 'X', 'name': 'not-a-kernel', 'dur': 9e9}, {'ph': 'M', 'name': kernels[0]}]
  summary = profile.summarize(events, text, steps=2)
  assert summary['kernel_ms_per_step'] == pytest.approx(2.)  # (3 + 1) ms over 2 steps
  (row,) = summary['rows']
  assert row['share'] == 1. and row['kernels'] == 1
  assert row['gflop_per_step'] == pytest.approx(2 * 8 * 16 * 4 / 1e9)
