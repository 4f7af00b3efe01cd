"""BiT: the Big Transfer ResNet-v2 (Kolesnikov et al., ECCV 2020), the ViT paper's CNN baseline.

Architecture and param tree, as the code released with the BiT paper (big_transfer `bit_jax`,
the tree big_vision's `bit_paper.py` also loads into; facts from reading both):

  root_block/conv_root   7x7/2 conv, zero padding 3 (then zero padding 1 and a 3x3/2 max-pool;
                         no norm or ReLU in the root: pre-activation)
  block{s}/unit{uu}      pre-activation bottleneck; s = 1..4, uu = 01, 02, ... (two digits):
                           p = relu(gn1(x))
                           shortcut = conv_proj(p) (1x1, stride) in unit01, else x
                           y = conv1(p) (1x1) -> gn2 -> relu -> conv2 (3x3, stride, zero padding
                               1) -> gn3 -> relu -> conv3 (1x1)
                           out = shortcut + y
                         mid width m = 64 * width_factor * 2^(s-1), output 4m; the stride is 1 in
                         stage 1 and 2 in unit01 of the later stages, in the 3x3 conv
  norm-pre-head          GroupNorm -> ReLU -> global average pooling
  head                   Dense, zero kernel, bias `head_bias_init`

Every conv is weight-standardised, (w - mean) / sqrt(var + 1e-10) per output channel, without
bias; every GroupNorm has 32 groups, eps 1e-5 and the two-pass variance E[(x - mean)^2].
Units per stage: R50 (3,4,6,3), R101 (3,4,23,3), R152 (3,8,36,3); depth = 3 * units + 2.
Conv kernels start as flax's lecun_normal (with weight standardisation their scale only sets the
effective learning rate), GroupNorms as scale 1 / bias 0, the head at zero.

Parameter count, with W = 64 * width_factor, C input channels, K classes, n_s units in stage s,
m_s = W * 2^(s-1), c = the input width of a unit (W into block1/unit01, 2 m_s into the unit01 of
the later stages, 4 m_s into every other unit):
  49 C W                                           conv_root
  + sum over units: 2c + c m + 2m + 9m^2 + 2m + 4m^2   gn1, conv1, gn2, conv2, gn3, conv3
  + sum over stages: 4 m_s * c                     conv_proj of unit01
  + 2 * 4 m_4 + 4 m_4 K + K                        norm-pre-head, head
BiT-R50x1 with 3 channels and 1000 classes: 25,549,352, exactly timm's `resnetv2_50x1_bit`, whose
layer shapes are the same (its head is a 1x1 conv with bias: the same count).

Differences between the references (read, not run):
- Weight standardisation: bit_jax and big_vision bit_paper.py sqrt(var + 1e-10) (this module);
  timm's BiT models sqrt(var + 1e-8); the ViT hybrid (the original vision_transformer code,
  big_vision's bit.py) std + 1e-5. - GroupNorm: bit_jax and bit_paper.py have their own, eps 1e-5,
  two-pass variance, params stored [1,1,1,C]; timm GroupNormAct eps 1e-5, params [C]; the hybrid
  flax's, eps 1e-6, E[x^2]-E[x]^2. Here flax's GroupNorm with eps 1e-5 and the two-pass variance;
  params [C] as the hybrid's. - Root max-pool: bit_jax pads with zeros then pools 'VALID', and
  timm's 'fixed' BiT stem does the same (ConstantPad2d(1, 0)); as no ReLU precedes the pool, a zero
  pad can win the max where the conv output is negative. big_vision bit_paper.py pads the pool with
  -inf (flax max_pool's explicit padding), which differs on the border. This module follows bit_jax
  (zeros). - Padding: bit_jax, bit_paper.py and timm pad symmetrically (3 for 7x7, 1 for 3x3); the
  hybrid uses TF 'SAME', which is asymmetric for stride 2 on even sizes.
- big_vision bit.py is a ResNet v1 (post-activation, gn3 scale 0, GroupNorm after conv_proj): the
  hybrid stem's unit (models/resnet.py), not BiT.
- Head: bit_jax names it conv_head, bit_paper.py and this module `head`; timm uses a 1x1 conv
  initialised normal(0.01) instead of zeros.
- Conv init: bit_jax and bit_paper.py flax's default (lecun_normal); timm kaiming_normal
  (fan_out) and, optionally (off by default), a zero conv3 in every unit. None of them zero-inits
  a GroupNorm (the v1 hybrid does: gn3).
- Stochastic depth (drop path on each unit's residual branch, rate linear in the unit index up
  to `stochastic_depth`) is timm's option; BiT trained without it (default 0 here).
- Depths: big_vision also defines R26 (2,2,2,2) (from timm); R14 (1,1,1,1) is this project's, for
  CPU work. Widths: the BiT release has R50x1, R50x3, R101x1, R101x3, R152x2, R152x4.
"""

import functools
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.errors import UserError
from vit_jax.models import resnet as resnet_lib
from vit_jax.models.bit_width import GN_GROUPS, root_width
from vit_jax.models.vit import drop_path

Dtype = Any

WS_EPS = 1e-10  # inside the sqrt: (w - mean) / sqrt(var + eps)
GN_EPS = 1e-5


def _conv(features: int, kernel: int, strides: Tuple[int, int] = (1, 1), pad: int = 0, *,
          dtype: Optional[Dtype], param_dtype: Dtype, name: str) -> resnet_lib.StdConv:
  return resnet_lib.StdConv(features, (kernel, kernel), strides, padding=((pad, pad), (pad, pad)),
                            ws_eps=WS_EPS, ws_eps_in_sqrt=True, dtype=dtype,
                            param_dtype=param_dtype, name=name)


def _group_norm(name: str, dtype: Optional[Dtype], param_dtype: Dtype) -> nn.GroupNorm:
  return resnet_lib.group_norm(name, dtype, param_dtype, epsilon=GN_EPS, use_fast_variance=False)


class RootBlock(nn.Module):
  """conv_root (7x7/2, zero padding 3) -> zero padding 1 -> 3x3/2 max-pool."""
  width: int
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = _conv(self.width, 7, (2, 2), 3, dtype=self.dtype, param_dtype=self.param_dtype,
              name='conv_root')(x)
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))  # zeros, not -inf (see the module docstring)
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding='VALID')


class PreActBottleneck(nn.Module):
  """Pre-activation bottleneck unit; `features` is the mid width, the output 4x that."""
  features: int
  strides: Tuple[int, int] = (1, 1)
  drop_path_rate: float = 0.
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    out = 4 * self.features
    conv = functools.partial(_conv, dtype=self.dtype, param_dtype=self.param_dtype)
    norm_relu = lambda name, y: nn.relu(_group_norm(name, self.dtype, self.param_dtype)(y))

    preact = norm_relu('gn1', x)
    shortcut = x
    if x.shape[-1] != out or tuple(self.strides) != (1, 1):
      shortcut = conv(out, 1, self.strides, name='conv_proj')(preact)
    y = conv(self.features, 1, name='conv1')(preact)
    y = conv(self.features, 3, self.strides, 1, name='conv2')(norm_relu('gn2', y))
    y = conv(out, 1, name='conv3')(norm_relu('gn3', y))
    if train and self.drop_path_rate > 0.:
      y = drop_path(y, self.drop_path_rate, self.make_rng('dropout'))
    return shortcut + y


class PreActStage(nn.Module):
  """Units unit01, unit02, ...; the first one carries the stride. One drop-path rate per unit."""
  features: int
  first_stride: Tuple[int, int]
  drop_path_rates: Tuple[float, ...]
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    for i, rate in enumerate(self.drop_path_rates):
      x = PreActBottleneck(self.features, self.first_stride if i == 0 else (1, 1), rate,
                           dtype=self.dtype, param_dtype=self.param_dtype,
                           name=f'unit{i + 1:02d}')(x, train)
    return x


def drop_path_rates(num_layers: Sequence[int], rate: float) -> Tuple[Tuple[float, ...], ...]:
  """Per stage, per unit: `rate` * i / (units - 1) for the i-th unit of the whole network."""
  total = sum(num_layers)
  rates = [rate * i / (total - 1) if total > 1 else 0. for i in range(total)]
  starts = [sum(num_layers[:s]) for s in range(len(num_layers))]
  return tuple(tuple(rates[a:a + n]) for a, n in zip(starts, num_layers))


class BiT(nn.Module):
  """BiT ResNet-v2 classifier: NHWC images in [-1, 1] -> float32 logits [B, num_classes].

  `num_layers`: units per stage; `width_factor`: 1 = the standard ResNet widths (64 channels
  after the root, 256..2048 out of the stages). `dtype` is the compute dtype of the convs and
  GroupNorms (GroupNorm statistics are float32); pooling and head run in float32.
  """
  num_classes: int
  num_layers: Tuple[int, ...] = (3, 4, 6, 3)
  width_factor: float = 1
  stochastic_depth: float = 0.
  head_bias_init: float = 0.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: jax.Array, *, train: bool) -> jax.Array:
    width = root_width(self.width_factor)
    units = tuple(int(n) for n in self.num_layers)
    if not units or min(units) < 1:
      raise UserError(f'BiT num_layers {self.num_layers} must give at least one unit per stage, '
                      'e.g. (3, 4, 6, 3) for R50')
    if inputs.ndim != 4:
      raise UserError(f'expected NHWC images [batch, height, width, channels], got shape '
                      f'{tuple(inputs.shape)}: add the missing batch or channel axis')
    x = RootBlock(width, self.dtype, self.param_dtype, name='root_block')(inputs.astype(self.dtype))
    for s, rates in enumerate(drop_path_rates(units, self.stochastic_depth)):
      x = PreActStage(width * 2 ** s, (1, 1) if s == 0 else (2, 2), rates, dtype=self.dtype,
                      param_dtype=self.param_dtype, name=f'block{s + 1}')(x, train)
    x = nn.relu(_group_norm('norm-pre-head', self.dtype, self.param_dtype)(x))
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                    bias_init=nn.initializers.constant(self.head_bias_init), dtype=jnp.float32,
                    param_dtype=self.param_dtype, name='head')(x)
