"""The TPU compiler's estimated step time turned into what a plan prints
(vit_jax/platform/estimate.py): images/s per chip, utilisation of the chip's peak, custom calls
costed from the model's shapes, durations; and the analytic attention FLOPs they are costed by
(vit_jax/models/cost.py). The compiles themselves: tests/test_compile_targets.py."""

import pytest

from vit_jax import models
from vit_jax.models import cost
from vit_jax.parallel import memory
from vit_jax.platform import chips
from vit_jax.platform import estimate

TERA = 1e12


def _chip(target):
  return next(c for c in chips.compile_targets('tpu') if c.target == target)


def test_a_v3_estimate_counts_the_two_cores_of_a_chip():
  """ViT-B/16, 64 images per core, one v3 core: 6.79 TFLOP in 142 ms is 77% of the core's
  61.5 TFLOP/s, and a v3 chip (two cores) does 2 x 64 / 0.142 images/s."""
  est = estimate.step({'flops': 6.79 * TERA, 'optimal_seconds': 0.142, 'custom_calls': 0}, 64,
                      _chip('v3'))
  assert est['seconds'] == 0.142 and est['uncosted_flops'] == 0
  assert est['images_per_second_per_chip'] == pytest.approx(128 / 0.142)
  assert est['utilisation'] == pytest.approx(6.79 / 0.142 / 61.5)
  # A megacore v4 chip is one device: images/s per chip is per device.
  v4 = estimate.step({'flops': 6.79 * TERA, 'optimal_seconds': 0.05, 'custom_calls': 0}, 64,
                     _chip('v4'))
  assert v4['images_per_second_per_chip'] == pytest.approx(64 / 0.05)
  assert v4['utilisation'] == pytest.approx(6.79 / 0.05 / 275)


def test_uncosted_custom_calls_are_added_at_the_peak_never_zero():
  cost_ = {'flops': 1 * TERA, 'optimal_seconds': 0.1, 'custom_calls': 4}
  est = estimate.step(cost_, 8, _chip('v5p'), uncosted_flops=0.459 * TERA)
  assert est['seconds'] == pytest.approx(0.1 + 0.001)  # 0.459 TFLOP at 459 TFLOP/s
  assert est['flops'] == pytest.approx(1.459 * TERA) and est['uncosted_flops'] == 0.459 * TERA
  # Without custom calls in the program nothing is added, whatever the model's attention.
  plain = estimate.step(dict(cost_, custom_calls=0), 8, _chip('v5p'), uncosted_flops=TERA)
  assert plain['seconds'] == 0.1 and plain['flops'] == TERA


def test_the_cost_models_minus_one_second_per_concat_bitcast_is_taken_back():
  """The TPU compiler's cost model counts each ConcatBitcast (an in-place concatenation) as -1 s
  (a v5e train step with 18 of them: -17.998 s): taken back, the step is the other ops' 2 ms."""
  est = estimate.step({'flops': 0.2 * TERA, 'optimal_seconds': -17.998, 'custom_calls': 0,
                       'concat_bitcasts': 18}, 32, _chip('v5e'))
  assert est['seconds'] == pytest.approx(0.002)
  assert est['utilisation'] == pytest.approx(0.2 / 0.002 / 197)
  # A time still negative once they are taken back holds another op the model could not cost.
  assert estimate.step({'flops': TERA, 'optimal_seconds': -6.0, 'concat_bitcasts': 5}, 8,
                       _chip('v6e')) is None


@pytest.mark.parametrize('seconds', [None, 0.0, -6.0])
def test_no_estimate_where_the_cost_model_gives_none(seconds):
  assert estimate.step({'flops': TERA, 'optimal_seconds': seconds}, 8, _chip('v6e')) is None


@pytest.mark.parametrize('seconds, text', [
    (0.000216, '0.216 ms'), (0.142, '142 ms'), (3.4, '3.4 s'), (750, '12.5 min'),
    (6.1 * 3600, '6.1 h'), (3.2 * 86400, '3.2 days'), (1.5 * 86400, '36 h')])
def test_durations_read_in_their_unit(seconds, text):
  assert estimate.duration(seconds) == text


@pytest.mark.parametrize('flops, text', [(6.79e12, '6.79 TFLOP'), (3e11, '300 GFLOP'),
                                         (2.13e7, '21.3 MFLOP')])
def test_flop_counts_read_in_their_unit(flops, text):
  assert estimate.flop_count(flops) == text


def test_the_report_says_how_long_and_what_was_not_costed():
  step = {'argument_bytes': 0, 'output_bytes': 0, 'alias_bytes': 0, 'temp_bytes': 0,
          'peak_bytes': 2 ** 30, 'flops': 6.79 * TERA, 'compile_seconds': 1.0, 'custom_calls': 24}
  train = estimate.step(dict(step, optimal_seconds=0.142), 64, _chip('v3'), 0.3 * TERA)
  evaluate = estimate.step(dict(step, flops=1.2 * TERA, optimal_seconds=0.04, custom_calls=0),
                           64, _chip('v3'))
  report = dict(step, platform='tpu', device_kind='8 x TPU v3', hbm_bytes=16 * 2 ** 30,
                param_bytes=0, opt_state_bytes=0, eval=dict(step, custom_calls=0),
                estimate={'train': train, 'eval': evaluate, 'steps': 20_000,
                          'run_seconds': 20_000 * train['seconds']})
  text = memory.format_report(report, 'ViT-B/16')
  assert ("estimated by the TPU compiler's cost model (a lower bound): train step 147 ms "
          '(871 images/s per chip, 78% of peak), eval step 40 ms (3,200 images/s per chip, '
          '49% of peak)') in text
  assert 'estimated run: 20,000 train steps x 147 ms = 49 min of train steps' in text
  assert ('note: the cost model does not cost the 24 Pallas calls (splash attention) of the '
          'train step: their attention matmuls, 300 GFLOP per device') in text
  assert 'eval step: their' not in text
  assert memory.format_report(dict(report, estimate={'missing': 'scan'}), 'x').count(
      "estimated step time: none (XLA counts a scanned encoder's loop once") == 1


def test_attention_flops_are_the_two_products_of_every_block():
  """ViT-B/16 at 224 px: 197 tokens, width 768, 12 blocks; Q K^T and the weighted sum of V are
  197 x 197 x 768 multiply-adds each. A BiT has none."""
  vit = models.create_model('ViT-B/16', num_classes=10)
  assert cost.attention_flops(vit, (224, 224, 3)) == 2 * 12 * 2 * 197 * 197 * 768
  assert cost.attention_flops(models.create_model('BiT-R50x1', num_classes=10),
                              (224, 224, 3)) == 0


def test_custom_calls_without_a_count_are_said_to_be_left_out():
  step = {'argument_bytes': 0, 'output_bytes': 0, 'alias_bytes': 0, 'temp_bytes': 0,
          'peak_bytes': 0, 'flops': TERA, 'compile_seconds': 1.0, 'custom_calls': 3,
          'optimal_seconds': 0.1}
  train = estimate.step(step, 8, _chip('v6e'))  # nothing counted for the calls
  report = dict(step, platform='tpu', device_kind='8 x TPU v6 lite', hbm_bytes=None,
                param_bytes=0, opt_state_bytes=0, eval=dict(step, custom_calls=0),
                estimate={'train': train, 'eval': None})
  text = memory.format_report(report, 'x')
  assert ('note: the cost model does not cost the 3 custom calls of the train step, and nothing '
          'here counts them: the train step takes longer than its estimate') in text
  assert 'eval step' not in text.split('estimated by')[1]
