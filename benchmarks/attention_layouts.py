"""Multi-head self-attention in four layouts on XLA:CPU, forward and forward + backward.

  PYTHONPATH=. .venv/bin/python benchmarks/attention_layouts.py --batch=32 --tokens=197 --heads=3

Same math and parameters in each (flax's query/key/value kernels [D, H, hd], out [H, hd, D]):
  tokens-major  the two attention einsums on [B, N, H, hd] (this project before, the original's
                flax layout)
  heads-major   q, k, v swapped to [B, H, N, hd] first, then plain batched matmuls (the model now)
  direct        the projections write [B, H, N, hd] themselves (einsum 'bnw,whd->bhnd')
  fused-qkv     one [D, 3H, hd] projection, then heads-major
  jax-dpa       the projections, then jax.nn.dot_product_attention (implementation='xla')
Prints the median time of each and its largest difference from tokens-major.
"""

import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

_BATCH = flags.DEFINE_integer('batch', 32, 'Batch size.')
_TOKENS = flags.DEFINE_integer('tokens', 197, 'Tokens (196 patches + cls at 224 px, patch 16).')
_HEADS = flags.DEFINE_integer('heads', 3, 'Heads (ViT-Ti: 3, S: 6, B: 12).')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Per-head width.')
_REPEATS = flags.DEFINE_integer('repeats', 7, 'Timed calls (median reported).')


def _project(x, params, name, out):
  kernel, bias = params[name]
  y = jnp.einsum(f'bnw,whd->{out}', x, kernel)
  return y + (bias if out == 'bnhd' else bias[None, :, None, :])


def _output(y, params, layout):
  kernel, bias = params['out']
  return jnp.einsum(f'{layout},hdw->bnw', y, kernel) + bias


def _heads_major_core(q, k, v, scale):
  weights = jax.nn.softmax(jnp.einsum('bhqd,bhkd->bhqk', q * scale, k), axis=-1)
  return jnp.einsum('bhqk,bhkd->bhqd', weights, v)


def tokens_major(params, x, scale):
  q, k, v = (_project(x, params, n, 'bnhd') for n in ('query', 'key', 'value'))
  weights = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q * scale, k), axis=-1)
  return _output(jnp.einsum('bhqk,bkhd->bqhd', weights, v), params, 'bnhd')


def heads_major(params, x, scale):
  q, k, v = (jnp.swapaxes(_project(x, params, n, 'bnhd'), 1, 2)
             for n in ('query', 'key', 'value'))
  return _output(jnp.swapaxes(_heads_major_core(q, k, v, scale), 1, 2), params, 'bnhd')


def direct(params, x, scale):
  q, k, v = (_project(x, params, n, 'bhnd') for n in ('query', 'key', 'value'))
  return _output(_heads_major_core(q, k, v, scale), params, 'bhnd')


def fused_qkv(params, x, scale):
  heads = params['query'][1].shape[0]
  kernel = jnp.concatenate([params[n][0] for n in ('query', 'key', 'value')], axis=1)
  bias = jnp.concatenate([params[n][1] for n in ('query', 'key', 'value')], axis=0)
  qkv = jnp.swapaxes(jnp.einsum('bnw,whd->bnhd', x, kernel) + bias, 1, 2)
  q, k, v = qkv[:, :heads], qkv[:, heads:2 * heads], qkv[:, 2 * heads:]
  return _output(jnp.swapaxes(_heads_major_core(q, k, v, scale), 1, 2), params, 'bnhd')


def jax_dpa(params, x, scale):
  q, k, v = (_project(x, params, n, 'bnhd') for n in ('query', 'key', 'value'))
  y = jax.nn.dot_product_attention(q, k, v, scale=scale, implementation='xla')
  return _output(y, params, 'bnhd')


LAYOUTS = {'tokens-major': tokens_major, 'heads-major': heads_major, 'direct': direct,
           'fused-qkv': fused_qkv, 'jax-dpa': jax_dpa}


def _median_ms(fn, *args) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def main(argv):
  del argv
  b, n, h, d = _BATCH.value, _TOKENS.value, _HEADS.value, _HEAD_DIM.value
  width, scale = h * d, d ** -0.5
  keys = iter(jax.random.split(jax.random.PRNGKey(0), 9))
  x = jax.random.normal(next(keys), (b, n, width))
  params = {name: (0.05 * jax.random.normal(next(keys), (width, h, d)), jnp.zeros((h, d)))
            for name in ('query', 'key', 'value')}
  params['out'] = (0.05 * jax.random.normal(next(keys), (h, d, width)), jnp.zeros((width,)))
  reference = jax.jit(tokens_major, static_argnums=2)(params, x, scale)
  print(f'batch {b}, {n} tokens, {h} heads of {d}: median of {_REPEATS.value} calls')
  print('| layout | forward ms | forward + backward ms | max abs diff |')
  print('|---|---|---|---|')
  for name, fn in LAYOUTS.items():
    forward = jax.jit(fn, static_argnums=2)
    grad = jax.jit(jax.grad(lambda p, x, f=fn: jnp.sum(f(p, x, scale) ** 2), argnums=(0, 1)))
    diff = float(jnp.max(jnp.abs(forward(params, x, scale) - reference)))
    print(f'| {name} | {_median_ms(forward, params, x, scale):.2f} | '
          f'{_median_ms(grad, params, x):.2f} | {diff:.1e} |')


if __name__ == '__main__':
  app.run(main)
