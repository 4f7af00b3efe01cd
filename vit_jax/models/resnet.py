"""ResNet pieces of the hybrid stem: weight-standardised convs and GroupNorm bottleneck units.

The hybrid models (R50+ViT-B/16, R+ViT-Ti/16, ...) run the image through a BiT-style ResNet (v1,
post-activation bottlenecks, GroupNorm, weight standardisation) and feed its feature map to the
ViT patch embedding. The stem itself (`conv_root`, `gn_root`, max-pool, stages `block1`, ...) is
built by `VisionTransformer` so that the parameter names sit at the top level, exactly as in the
official checkpoints; this file only holds the building blocks and the stem's config.
"""

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.errors import UserError

Dtype = Any

WS_EPS = 1e-5  # Added to the std (not the variance), as the original code does.


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """The hybrid stem: `num_layers` units per stage (() = stem only) and a width multiplier."""
  num_layers: Tuple[int, ...] = ()
  width_factor: int = 1

  @property
  def width(self) -> int:
    """Channels after the root conv; stage s has bottleneck width `width * 2**s` (out 4x that)."""
    return int(64 * self.width_factor)

  @property
  def stride(self) -> int:
    """Total downsampling of the stem: root conv (2) x max-pool (2) x 2 per stage after the first."""
    return 4 * 2 ** max(len(self.num_layers) - 1, 0)


def weight_standardize(w: jax.Array, eps: float = WS_EPS, *, eps_in_sqrt: bool = False
                       ) -> jax.Array:
  """Per output channel, statistics over (kh, kw, in): (w - mean) / (std + eps), as the ViT
  hybrid; with `eps_in_sqrt`, (w - mean) / sqrt(var + eps), as BiT (eps 1e-10)."""
  axes = tuple(range(w.ndim - 1))
  w = w - jnp.mean(w, axis=axes, keepdims=True)
  if eps_in_sqrt:
    return w * jax.lax.rsqrt(jnp.mean(jnp.square(w), axis=axes, keepdims=True) + eps)
  return w / (jnp.std(w, axis=axes, keepdims=True) + eps)


class StdConv(nn.Module):
  """2-D convolution (no bias) whose kernel is weight-standardised on the fly.

  The stored `kernel` param is the raw (unstandardised) weight, [kh, kw, in, out] like nn.Conv.
  `padding` is 'SAME' (TF-style, the hybrid) or explicit ((top, bottom), (left, right)) zero
  padding (BiT); `ws_eps` and `ws_eps_in_sqrt` choose the standardisation (`weight_standardize`).
  """
  features: int
  kernel_size: Tuple[int, int]
  strides: Tuple[int, int] = (1, 1)
  padding: Any = 'SAME'
  ws_eps: float = WS_EPS
  ws_eps_in_sqrt: bool = False
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = self.param('kernel', nn.initializers.lecun_normal(), shape, self.param_dtype)
    # Standardise in float32 (the statistics need it), then run the conv in the compute dtype.
    kernel = weight_standardize(kernel.astype(jnp.float32), self.ws_eps,
                                eps_in_sqrt=self.ws_eps_in_sqrt)
    dtype = self.dtype or jnp.result_type(x.dtype, self.param_dtype)
    padding = self.padding if isinstance(self.padding, str) else tuple(map(tuple, self.padding))
    if _is_pointwise(self.kernel_size, self.strides, padding):
      return jnp.einsum('...c,co->...o', x.astype(dtype), kernel[0, 0].astype(dtype))
    return jax.lax.conv_general_dilated(
        x.astype(dtype), kernel.astype(dtype),
        window_strides=self.strides, padding=padding,
        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def _is_pointwise(kernel_size, strides, padding) -> bool:
  """A 1x1 convolution with stride 1 and no padding: a matmul over the channels, which StdConv
  runs as one. As a convolution, its kernel gradient made XLA:CPU copy the input to a
  channels-first layout, and each copy recomputed the stage's chain of earlier units
  (GroupNorm, residual adds) inside it, which made the hybrid's train step markedly slower.
  Same values and gradients (tests/test_models.py)."""
  no_padding = padding in ('SAME', 'VALID') or all(p == (0, 0) for p in padding)
  return tuple(kernel_size) == (1, 1) and tuple(strides) == (1, 1) and no_padding


def group_norm(name: str, dtype: Optional[Dtype], param_dtype: Dtype, zero_scale=False, *,
               epsilon: float = 1e-6, use_fast_variance: bool = True):
  """flax GroupNorm, 32 groups, with flax's defaults (eps 1e-6, variance as E[x^2] - E[x]^2) as
  the hybrid; BiT passes eps 1e-5 and the two-pass variance E[(x - mean)^2]. zero_scale: the
  hybrid's gn3 starts with scale 0."""
  scale_init = nn.initializers.zeros if zero_scale else nn.initializers.ones
  return nn.GroupNorm(num_groups=32, epsilon=epsilon, use_fast_variance=use_fast_variance,
                      scale_init=scale_init, dtype=dtype, param_dtype=param_dtype, name=name)


class ResidualUnit(nn.Module):
  """Bottleneck unit (ResNet v1, post-activation); `features` is the mid width, output 4x that."""
  features: int
  strides: Tuple[int, int] = (1, 1)
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    out = 4 * self.features
    conv = lambda f, k, s, name: StdConv(f, k, s, dtype=self.dtype, param_dtype=self.param_dtype,
                                         name=name)
    gn = lambda name, zero=False: group_norm(name, self.dtype, self.param_dtype, zero)

    shortcut = x
    if x.shape[-1] != out or tuple(self.strides) != (1, 1):
      shortcut = conv(out, (1, 1), self.strides, 'conv_proj')(x)
      shortcut = gn('gn_proj')(shortcut)

    y = nn.relu(gn('gn1')(conv(self.features, (1, 1), (1, 1), 'conv1')(x)))
    y = nn.relu(gn('gn2')(conv(self.features, (3, 3), self.strides, 'conv2')(y)))
    y = gn('gn3', zero=True)(conv(out, (1, 1), (1, 1), 'conv3')(y))
    return nn.relu(shortcut + y)


class ResNetStage(nn.Module):
  """`num_units` bottleneck units named unit1, unit2, ...; the first one carries the stride."""
  num_units: int
  features: int
  first_stride: Tuple[int, int] = (1, 1)
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i in range(self.num_units):
      strides = self.first_stride if i == 0 else (1, 1)
      x = ResidualUnit(self.features, strides, dtype=self.dtype, param_dtype=self.param_dtype,
                       name=f'unit{i + 1}')(x)
    return x


def resnet_stem(x: jax.Array, config: ResNetConfig, dtype: Optional[Dtype],
                param_dtype: Dtype) -> jax.Array:
  """Hybrid stem; call it inside a compact __call__: its submodules bind to that module, so the
  params get the official top-level names.

  conv_root (7x7/2) -> gn_root -> relu -> max-pool 3x3/2 'SAME' -> stages block1, block2, ...
  """
  width = config.width
  x = StdConv(width, (7, 7), (2, 2), dtype=dtype, param_dtype=param_dtype, name='conv_root')(x)
  x = nn.relu(group_norm('gn_root', dtype, param_dtype)(x))
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding='SAME')
  for s, num_units in enumerate(config.num_layers):
    stride = (1, 1) if s == 0 else (2, 2)
    x = ResNetStage(num_units, width * 2 ** s, stride, dtype=dtype, param_dtype=param_dtype,
                    name=f'block{s + 1}')(x)
  return x


def as_resnet_config(resnet: Any) -> Optional[ResNetConfig]:
  """Accepts None, a ResNetConfig or a mapping {num_layers, width_factor}."""
  if resnet is None or isinstance(resnet, ResNetConfig):
    return resnet
  resnet = dict(resnet)
  unknown = sorted(set(resnet) - {'num_layers', 'width_factor'})
  if unknown:
    raise UserError(f'unknown resnet option(s) {unknown}: valid are num_layers, width_factor')
  num_layers: Sequence[int] = resnet.pop('num_layers', ())
  return ResNetConfig(num_layers=tuple(int(n) for n in num_layers), **resnet)
