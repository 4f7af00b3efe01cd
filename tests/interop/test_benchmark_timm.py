"""`--compare=timm` in a smoke configuration: timm times the same model alternately with ours."""

import json
import os
import subprocess
import sys

import jax
import pytest

from vit_jax.configs import mnist5k
from vit_jax.tools.benchmarking import compare
from helpers import ROOT


def test_compare_with_timm_reports_a_ratio():
  for mode in ('train', 'infer'):
    result = compare.run_benchmark(mnist5k.get_config(), model='ViT-Ze/4', batch_size=8,
                                   image_size=28, mode=mode, dtype='float32', steps=3, rounds=2,
                                   compare_with='timm')
    assert len(result['step_s_all']) == len(result['timm_step_s_all']) == 6
    assert result['timm_img_per_s'] > 0
    assert result['ratio_vs_timm'] == result['img_per_s'] / result['timm_img_per_s']


def _classes_present(prof):
  assert sum(prof['classes'].values()) == pytest.approx(prof['kernel_ms_per_step'])
  return {c for c, t in prof['classes'].items() if t > 0}


def test_the_profile_puts_ours_and_timm_in_the_same_kernel_classes():
  """On this CPU: our XLA:CPU kernels by their HLO, timm's ATen ops by name and enclosing op
  (torch.profiler's own CPU time), one table."""
  result = compare.run_benchmark(mnist5k.get_config(), model='ViT-Ze/4', batch_size=8,
                                 image_size=28, mode='train', dtype='float32', steps=2, rounds=1,
                                 compare_with='timm', profile=True)
  step_parts = {'GEMM', 'attention', 'LayerNorm', 'GELU and other elementwise', 'softmax',
                'optimizer'}
  assert step_parts <= _classes_present(result['profile'])
  theirs = result['timm_profile']
  assert step_parts <= _classes_present(theirs)
  assert theirs['source'] == "torch.profiler, each op's own CPU time"
  top = {name: cls for name, cls, _ in theirs['top']}
  assert top.get('aten::native_layer_norm') == 'LayerNorm' and top.get('aten::addmm') == 'GEMM'
  assert compare.format_result(result).split('by kernel class (ms per step):\n')[1].startswith(
      '| kernel class | ours ms | timm ms | ours - timm |\n|---|---|---|---|\n| GEMM |')


def test_the_smoke_suite_profiles_both_sides_in_one_table(tmp_path):
  """`bench --suite=smoke --compare=timm --suite_profile`: ours and timm eager (on the CPU), each
  in its own process, timed, profiled and lined up by kernel class."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
      os.path.join(ROOT, 'tests', 'interop', 'stubs'), os.environ.get('PYTHONPATH')])))
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'bench', '--suite=smoke', '--compare=timm',
       '--suite_only=Ze/4-train-ours-einsum,Ze/4-train-timm-eager', '--suite_profile', '--json'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout)['rows']
  assert [(r['id'], r['ok']) for r in rows] == [('Ze/4-train-ours-einsum', True),
                                                ('Ze/4-train-timm-eager', True)], rows
  assert all({'GEMM', 'LayerNorm', 'optimizer'} <= _classes_present(r['profile']) for r in rows)
  assert rows[0]['versions']['jax'] == jax.__version__ and rows[1]['versions']['timm']
  assert ('ViT-Ze/4 train, batch 8: ms per step by kernel class\n| kernel class | '
          'Ze/4-train-ours-einsum ms | Ze/4-train-timm-eager ms |') in proc.stderr
