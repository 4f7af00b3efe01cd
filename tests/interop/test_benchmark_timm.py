"""`--compare=timm` in a smoke configuration: timm times the same model alternately with ours."""

from vit_jax.configs import mnist5k
from vit_jax.benchmarking import compare


def test_compare_with_timm_reports_a_ratio():
  for mode in ('train', 'infer'):
    result = compare.run_benchmark(mnist5k.get_config(), model='ViT-Ze/4', batch_size=8,
                                   image_size=28, mode=mode, dtype='float32', steps=3, rounds=2,
                                   compare_with='timm')
    assert len(result['step_s_all']) == len(result['timm_step_s_all']) == 6
    assert result['timm_img_per_s'] > 0
    assert result['ratio_vs_timm'] == result['img_per_s'] / result['timm_img_per_s']
