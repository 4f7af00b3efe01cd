"""Compute cost of a model from XLA's cost analysis (the FLOPs axis of the paper's Figure 5).

XLA counts what the compiled program does: 2 FLOPs per multiply-add, plus norms, activations
and softmax. Some of it does not grow with the batch (a BiT standardises its conv kernels once
per step), so the per-image cost is the slope between two batch sizes, and the rest is reported
as a per-step constant:  FLOPs(batch) = batch * per_image + per_step.
"""

from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import variants


class Flops(NamedTuple):
  per_image: float  # grows with the batch
  per_step: float   # once per call, whatever the batch (e.g. weight standardisation)

  def total(self, batch: int) -> float:
    return batch * self.per_image + self.per_step


def compiled_flops(model: nn.Module, image_shape: Sequence[int], batch: int, *,
                   backward: bool = False) -> float:
  """XLA's FLOPs of one call on `batch` images of `image_shape` (H, W, C), compiled on the
  default backend. `backward`: the forward pass and the gradient w.r.t. all params (a train
  step without the optimizer update), else the eval forward pass."""
  x = jax.ShapeDtypeStruct((batch, *image_shape), jnp.float32)
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)['params']
  forward = lambda p, x: model.apply({'params': p}, x, train=False)
  fn = jax.grad(lambda p, x: jnp.sum(forward(p, x))) if backward else forward
  analysis = jax.jit(fn).lower(params, x).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
    analysis = analysis[0]
  return float(analysis['flops'])


def largest_activation(model_name: str, image_size: int, batch: int) -> int:
  """Values in the largest activation of `model_name` on `batch` images of `image_size` px, from
  its shape alone: batch x the larger of the transformer's tokens x width (patches + 1) and a
  ResNet's first feature map (image / 4 squared x channels after the stem or its first stage)."""
  _, kwargs = variants.decode(model_name)
  if 'hidden_size' in kwargs:  # a ViT or a hybrid
    resnet, patch = kwargs['resnet'], kwargs['patch_size'][0]
    stride = patch * (resnet.stride if resnet is not None else 1)
    per_image = ((image_size // stride) ** 2 + 1) * kwargs['hidden_size']
    if resnet is not None:
      channels = resnet.width * (4 if resnet.num_layers else 1)
      per_image = max(per_image, (image_size // 4) ** 2 * channels)
  else:  # a BiT: its first stage's output
    per_image = (image_size // 4) ** 2 * 4 * int(64 * kwargs['width_factor'])
  return batch * per_image


def flops(model: nn.Module, image_shape: Sequence[int], *, backward: bool = False) -> Flops:
  """Per-image and per-step FLOPs from compiling batches of 1 and 2."""
  one, two = (compiled_flops(model, image_shape, b, backward=backward) for b in (1, 2))
  return Flops(per_image=two - one, per_step=2 * one - two)
