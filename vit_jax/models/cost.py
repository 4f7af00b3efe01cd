"""Compute cost of a model: counted from its shapes (`forward_flops`, `train_flops`) or by XLA's
cost analysis (`compiled_flops`, `flops`; the FLOPs axis of the paper's Figure 5).

The analytic count is what MFU (model FLOPs utilisation) divides by the chip's peak: the
multiply-adds of every matmul and convolution (2 FLOPs each) of one image's forward pass, and for a
train step 3x that (the backward pass takes two matmuls per forward matmul: the gradients with
respect to the input and to the weights; the PaLM paper's MFU convention, Appendix B). Norms,
activations, softmax and the optimizer update are not counted. XLA's count of the compiled program
on the CPU is within a few percent of it (tests/test_cost.py states the tolerance per family);
on a GPU XLA does not count what cuBLAS and cuDNN run, so only the analytic count holds there.

XLA counts what the compiled program does: 2 FLOPs per multiply-add, plus norms, activations
and softmax. Some of it does not grow with the batch (a BiT standardises its conv kernels once
per step), so the per-image cost is the slope between two batch sizes, and the rest is reported
as a per-step constant:  FLOPs(batch) = batch * per_image + per_step.
"""

from typing import NamedTuple, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import resnet as resnet_lib
from vit_jax.models.bit import BiT
from vit_jax.models.mixer import MlpMixer
from vit_jax.models import vit as vit_lib



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


def flops(model: nn.Module, image_shape: Sequence[int], *, backward: bool = False) -> Flops:
  """Per-image and per-step FLOPs from compiling batches of 1 and 2."""
  one, two = (compiled_flops(model, image_shape, b, backward=backward) for b in (1, 2))
  return Flops(per_image=two - one, per_step=2 * one - two)


def _conv_out(size: int, kernel: int, stride: int, padding) -> int:
  """Output side of a convolution or pool: 'SAME' (TF) or symmetric zero padding `padding`."""
  if padding == 'SAME':
    return -(-size // stride)
  return (size + 2 * padding - kernel) // stride + 1


def _taps(size: int, kernel: int, stride: int, padding) -> int:
  """Kernel taps that land inside the input, summed over the output positions of one axis (a
  tap on the zero padding multiplies nothing: XLA does not count it either)."""
  out = _conv_out(size, kernel, stride, padding)
  if padding == 'SAME':
    padding = max((out - 1) * stride + kernel - size, 0) // 2
  return sum(min(o * stride - padding + kernel, size) - max(o * stride - padding, 0)
             for o in range(out))


def _conv(hw: Tuple[int, int], cin: int, cout: int, kernel: int, stride: int, padding
          ) -> Tuple[float, Tuple[int, int]]:
  """(multiply-adds, output (h, w)) of a kernel x kernel convolution."""
  taps = _taps(hw[0], kernel, stride, padding) * _taps(hw[1], kernel, stride, padding)
  return taps * cin * cout, tuple(_conv_out(s, kernel, stride, padding) for s in hw)


def _bottlenecks(hw, c: int, width: int, num_layers, padding) -> Tuple[float, Tuple[int, int], int]:
  """(multiply-adds, output (h, w), channels) of ResNet stages of bottleneck units, v1 (hybrid,
  'SAME' padding) or v2 (BiT, padding 1): the same convolutions, the stride in the 3x3 conv and
  the projection shortcut where the shape changes."""
  macs = 0.
  for s, units in enumerate(num_layers):
    f = width * 2 ** s
    for u in range(units):
      stride = 2 if (s > 0 and u == 0) else 1
      conv2, out = _conv(hw, f, f, 3, stride, padding)
      if c != 4 * f or stride != 1:
        macs += out[0] * out[1] * c * 4 * f                       # conv_proj (1x1, stride)
      macs += hw[0] * hw[1] * c * f + conv2 + out[0] * out[1] * f * 4 * f  # conv1, 2, 3
      hw, c = out, 4 * f
  return macs, hw, c


def _vit_stem(model, image_shape: Sequence[int]):
  """(multiply-adds of a hybrid's ResNet stem or 0, those of its first conv or None, the feature
  map (h, w) and channels the patch embedding reads) of a ViT or hybrid."""
  h, w, channels = image_shape
  resnet = resnet_lib.as_resnet_config(model.resnet)
  if resnet is None:
    return 0., None, (h, w), channels
  # models/resnet.py: conv_root 7x7/2, max-pool 3x3/2, 'SAME'
  first, (h, w) = _conv((h, w), channels, resnet.width, 7, 2, 'SAME')
  h, w = (_conv_out(s, 3, 2, 'SAME') for s in (h, w))
  macs, (h, w), channels = _bottlenecks((h, w), resnet.width, resnet.width, resnet.num_layers,
                                        'SAME')
  return macs + first, first, (h, w), channels


def _tokens(model, hw: Tuple[int, int]) -> int:
  """The encoder's sequence length over a feature map of `hw`: patches, cls and registers."""
  ph, pw = model.patch
  return (hw[0] // ph) * (hw[1] // pw) + vit_lib.num_prefix_tokens(model)


def _vit_macs(model, image_shape: Sequence[int]) -> Tuple[float, float]:
  """(forward multiply-adds, those of the layer that reads the image) of a ViT or hybrid."""
  macs, first, (h, w), channels = _vit_stem(model, image_shape)
  ph, pw = model.patch
  gh, gw = h // ph, w // pw
  d, m = model.hidden_size, model.mlp_dim
  embedding = gh * gw * ph * pw * channels * d
  macs += embedding
  first = first if first is not None else embedding
  n = _tokens(model, (h, w))
  # Per block: q, k, v and out projections, Q K^T and the weighted sum of V, the MLP.
  macs += model.num_layers * (4 * n * d * d + 2 * n * n * d + 2 * n * d * m)
  rows = n - model.num_registers if model.classifier == 'unpooled' else 1
  if model.representation_size is not None:
    macs += rows * d * model.representation_size
    d = model.representation_size
  return macs + rows * d * model.num_classes, first          # head


def _bit_macs(model, image_shape: Sequence[int]) -> Tuple[float, float]:
  """The same for a BiT ResNet-v2 (models/bit.py): conv_root 7x7/2 padding 3, a 3x3/2 pool
  after padding 1, pre-activation bottlenecks, the head on the pooled features."""
  h, w, channels = image_shape
  width = int(64 * model.width_factor)
  first, (h, w) = _conv((h, w), channels, width, 7, 2, 3)
  h, w = (_conv_out(s, 3, 2, 1) for s in (h, w))
  macs, _, c = _bottlenecks((h, w), width, width, model.num_layers, 1)
  return first + macs + c * model.num_classes, first


def _mixer_macs(model, image_shape: Sequence[int]) -> Tuple[float, float]:
  """The same for an MLP-Mixer (models/mixer.py): the stem, per block the token-mixing MLP
  (over the n patches, for each of the d channels) and the channel-mixing MLP, the head."""
  h, w, channels = image_shape
  ph, pw = model.patch
  n, d = (h // ph) * (w // pw), model.hidden_size
  first = n * ph * pw * channels * d
  block = 2 * d * n * model.tokens_mlp_dim + 2 * n * d * model.channels_mlp_dim
  return first + model.num_layers * block + d * model.num_classes, first


def _macs(model, image_shape):
  if isinstance(model, MlpMixer):
    return _mixer_macs(model, image_shape)
  return (_bit_macs if isinstance(model, BiT) else _vit_macs)(model, image_shape)


def forward_flops(model: nn.Module, image_shape: Sequence[int]) -> float:
  """Matmul and convolution FLOPs (2 per multiply-add) of one image's forward pass through
  `model` (a VisionTransformer, hybrid, BiT or MLP-Mixer module) on images of `image_shape` (H, W, C)."""
  return 2. * _macs(model, image_shape)[0]


def attention_flops(model: nn.Module, image_shape: Sequence[int]) -> float:
  """FLOPs of one image's forward pass in the attention products alone (Q K^T and the weighted
  sum of V, every block): what a fused attention kernel computes. 0 for a model without
  attention (a BiT)."""
  if isinstance(model, BiT) or not getattr(model, 'num_heads', None):
    return 0.
  _, _, hw, _ = _vit_stem(model, image_shape)
  n = _tokens(model, hw)
  return 2. * model.num_layers * 2 * n * n * model.hidden_size


def train_flops(model: nn.Module, image_shape: Sequence[int]) -> float:
  """Matmul and convolution FLOPs of one image's train step: the forward pass, and in the
  backward pass the weight gradient of every layer and the input gradient of every layer but the
  first (the image needs none): exactly 3 x forward - 1 x the first layer. Rematerialisation's
  recomputed forward matmuls are not counted (the model's FLOPs, not the hardware's)."""
  macs, first = _macs(model, image_shape)
  return 2. * (3 * macs - first)
