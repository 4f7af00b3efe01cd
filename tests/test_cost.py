"""The analytic FLOP count (vit_jax/models/cost.py) against XLA:CPU's cost analysis, per family.

XLA counts every operation of the compiled program; the analytic count has only the matmuls and
convolutions, so XLA's figure is the larger by the norms, activations and softmax: 0.4-3.1% for
these models (ViT-Ti/16 1.2%, R+ViT-Ti/16 1.6-2.2%, BiT-R14x0.5 2.4-3.1%). The tolerance, 4%,
holds for any width of 192 or more; a tiny ViT-Ze/4 (width 32) has 8-10% of elementwise work.
"""

import pytest

from vit_jax.models import cost
from vit_jax.models import create_model

TOLERANCE = 0.04


@pytest.mark.slow
@pytest.mark.parametrize('name, size', [('ViT-Ti/16', 64), ('R+ViT-Ti/16', 64),
                                        ('BiT-R14x0.5', 32)])
def test_analytic_flops_match_xla_cpu(name, size):
  model = create_model(name, num_classes=10)
  shape = (size, size, 3)
  xla_forward = cost.flops(model, shape).per_image
  xla_train = cost.flops(model, shape, backward=True).per_image
  assert 1.0 <= xla_forward / cost.forward_flops(model, shape) <= 1 + TOLERANCE
  assert 1.0 <= xla_train / cost.train_flops(model, shape) <= 1 + TOLERANCE


def test_vit_b16_counts_the_known_figures():
  """ViT-B/16 at 224 px: 17.56 G multiply-adds forward (the figure timm lists, 17.6 GMACs), and a
  train step 3x that less the patch embedding's input gradient."""
  model = create_model('ViT-B/16', num_classes=1000)
  forward = cost.forward_flops(model, (224, 224, 3))
  d, n, layers = 768, 197, 12
  macs = 196 * 16 * 16 * 3 * d + layers * (4 * n * d * d + 2 * n * n * d + 2 * n * d * 4 * d) + d * 1000
  assert forward == 2 * macs
  assert cost.train_flops(model, (224, 224, 3)) == 2 * (3 * macs - 196 * 16 * 16 * 3 * d)
  assert 105.1e9 < cost.train_flops(model, (224, 224, 3)) < 105.2e9


def test_padding_taps_are_not_counted():
  """A 3x3 'SAME' convolution on a 4-pixel axis: 2 + 3 + 3 + 2 taps land inside; a 7x7/2 one with
  padding 3 on 8 pixels: outputs 0..3 see 4, 6, 7, 5 taps."""
  assert cost._taps(4, 3, 1, 'SAME') == 10
  assert cost._taps(8, 7, 2, 3) == 4 + 6 + 7 + 5
  assert cost._taps(8, 1, 1, 0) == 8


def test_bigger_models_cost_more_and_hybrids_count_their_stem():
  image = (224, 224, 3)
  flops = {n: cost.forward_flops(create_model(n, num_classes=1000), image)
           for n in ('ViT-Ti/16', 'ViT-B/16', 'ViT-L/16', 'R50+ViT-B/16', 'BiT-R50x1', 'BiT-R50x3')}
  assert flops['ViT-Ti/16'] < flops['ViT-B/16'] < flops['ViT-L/16']
  assert flops['R50+ViT-B/16'] > flops['ViT-B/16']
  assert 7.5e9 < flops['BiT-R50x1'] < 8.3e9  # ResNet-50: about 4 G multiply-adds
  assert flops['BiT-R50x3'] > 8 * flops['BiT-R50x1']
