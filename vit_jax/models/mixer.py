"""MLP-Mixer (Tolstikhin et al. 2021, "MLP-Mixer: An all-MLP Architecture for Vision").

Param names equal the original code's linen tree (the original repository's `models_mixer.py`), so
its released .npz checkpoints map 1:1:

  stem/{kernel,bias}                                  patch embedding, Conv p x p stride p
  MixerBlock_{i}/LayerNorm_0, token_mixing/{Dense_0,Dense_1},
                LayerNorm_1, channel_mixing/{Dense_0,Dense_1}
  pre_head_layer_norm
  head                                                zero kernel, bias = head_bias_init

The token-mixing MLP acts on the patch axis, so a Mixer runs at the one image size its params
were made for (the patch count is a weight dimension).
"""

from typing import Any, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.errors import UserError
from vit_jax.models.vit import LN_EPS, MlpBlock

Dtype = Any


class MixerBlock(nn.Module):
  """x + token_mixing(LN(x) over patches); then x + channel_mixing(LN(x))."""
  tokens_mlp_dim: int
  channels_mlp_dim: int
  gelu_approximate: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    norm = lambda: nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=self.param_dtype)
    # The ViT's MLP (Dense_0 -> GELU -> Dense_1, no dropout here): the original's `MlpBlock`.
    mlp = lambda n, name, y: MlpBlock(n, gelu_approximate=self.gelu_approximate, dtype=self.dtype,
                                      param_dtype=self.param_dtype, name=name)(y, True)
    y = jnp.swapaxes(norm()(x), 1, 2)
    x = x + jnp.swapaxes(mlp(self.tokens_mlp_dim, 'token_mixing', y), 1, 2)
    return x + mlp(self.channels_mlp_dim, 'channel_mixing', norm()(x))


class MlpMixer(nn.Module):
  """Mixer classifier: NHWC images in [-1, 1] -> float32 logits [B, num_classes]."""
  num_classes: int
  patch_size: Union[int, Tuple[int, int]]
  hidden_size: int
  num_layers: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  head_bias_init: float = 0.
  gelu_approximate: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @property
  def patch(self) -> Tuple[int, int]:
    p = self.patch_size
    return (int(p), int(p)) if isinstance(p, int) else (int(p[0]), int(p[1]))

  @nn.compact
  def __call__(self, inputs: jax.Array, *, train: bool) -> jax.Array:
    del train  # no dropout
    if inputs.ndim != 4:
      raise UserError(f'expected NHWC images [batch, height, width, channels], got shape '
                      f'{tuple(inputs.shape)}: add the missing batch or channel axis')
    ph, pw = self.patch
    if inputs.shape[1] % ph or inputs.shape[2] % pw:
      raise UserError(f'image size {inputs.shape[1]}x{inputs.shape[2]} is not divisible by the '
                      f'patch size {ph} of this Mixer: use a multiple of {ph}')
    x = nn.Conv(self.hidden_size, (ph, pw), strides=(ph, pw), padding='VALID', dtype=self.dtype,
                param_dtype=self.param_dtype, name='stem')(inputs.astype(self.dtype))
    b, h, w, d = x.shape
    x = jnp.reshape(x, (b, h * w, d))
    for i in range(self.num_layers):
      x = MixerBlock(self.tokens_mlp_dim, self.channels_mlp_dim, self.gelu_approximate,
                     self.dtype, self.param_dtype, name=f'MixerBlock_{i}')(x)
    x = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=self.param_dtype,
                     name='pre_head_layer_norm')(x)
    x = jnp.mean(x.astype(jnp.float32), axis=1)
    self.sow('intermediates', 'features', x)
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                    bias_init=nn.initializers.constant(self.head_bias_init), dtype=jnp.float32,
                    param_dtype=self.param_dtype, name='head')(x)


__all__ = ['MixerBlock', 'MlpMixer']
