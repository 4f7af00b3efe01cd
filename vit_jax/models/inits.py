"""The random parameter initialisers of the models, each compiled once per shape.

Each is flax's initialiser of the same name inside `jax.jit` (shape and dtype static). Traced
inside another jit (`jax.jit(model.init)`, every step) the inner jit is inlined: the program and
its values are flax's own. Called outside a jit, as `Module.lazy_init` does for the known part
of an init (`train/program.py: Init.on_host`), each is one small program, compiled once per
(shape, dtype) and reused by every layer of that shape, instead of one program that holds every
layer's random-number generation. ViT-Ti/16's initial train state (AMD EPYC family 26 model 2):
3.6-3.8 s and 4.8-5.0 CPU-s as one program, 1.8 s and 2.3-2.4 CPU-s this way, the same
21,560,876 values bitwise (benchmarks/README.md, "Time to the first step").

Constant initialisers (zeros, ones) stay flax's: run outside a jit they are exact anyway.
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Initializer = Callable[..., jax.Array]  # (key, shape, dtype=float32) -> array


def compiled(init: Initializer) -> Initializer:
  """`init` jitted with its shape and dtype static (a list shape, as flax passes some, is made
  a tuple first)."""
  jitted = jax.jit(init, static_argnums=(1, 2))

  @functools.wraps(init)
  def call(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    return jitted(key, tuple(int(d) for d in shape), dtype)
  return call


# One object per initialiser and argument: jit's compile cache is per function object.
@functools.lru_cache(maxsize=None)
def xavier_uniform() -> Initializer:
  return compiled(nn.initializers.xavier_uniform())


@functools.lru_cache(maxsize=None)
def lecun_normal() -> Initializer:
  return compiled(nn.initializers.lecun_normal())


@functools.lru_cache(maxsize=None)
def normal(stddev: float) -> Initializer:
  return compiled(nn.initializers.normal(stddev=stddev))


__all__ = ['compiled', 'lecun_normal', 'normal', 'xavier_uniform']
