"""The benchmark in a tiny smoke configuration: every field present and sane (no timed assertion)."""

import json
import os
import subprocess
import sys

import pytest

from vit_jax.configs import mnist5k
from vit_jax.tools.benchmarking import compare
from vit_jax.tools.benchmarking import profile
from helpers import ROOT

FIELDS = ('img_per_s', 'compile_s', 'flops_per_img', 'achieved_flops', 'matmul_peak_flops',
          'utilization', 'peak_bytes')


@pytest.mark.parametrize('mode', ['train', 'infer'])
def test_train_and_infer_report_every_field(mode):
  result = compare.run_benchmark(mnist5k.get_config(), model='ViT-Ze/4', batch_size=8,
                                 image_size=28, mode=mode, dtype='float32', steps=3,
                                 profile=True)
  for field in FIELDS:
    assert result[field] > 0, field
  assert result['minor_faults_per_step'] >= 0
  assert len(result['step_s_all']) == 3
  assert result['img_per_s'] == pytest.approx(8 / sorted(result['step_s_all'])[1])
  assert result['utilization'] == pytest.approx(result['achieved_flops'] /
                                                result['matmul_peak_flops'])
  # Forward FLOPs of ViT-Ze/4 at 28 px: patch embedding and 2 blocks, about 2.7 MFLOP per image;
  # a train step (forward + backward + Adam) costs about three times that.
  per_image = result['flops_per_img']
  assert (2e6 < per_image < 4e6) if mode == 'infer' else (6e6 < per_image < 12e6), per_image
  # The scanned encoder does the same work: XLA counts its loop body once, the benchmark does not
  # (it counts the unrolled step's lowering, before XLA's optimisations: 0.1-0.8% below).
  config = mnist5k.get_config()
  config.model.scan = True
  scanned = compare.run_benchmark(config, model='ViT-Ze/4', batch_size=8, image_size=28, mode=mode,
                                  dtype='float32', steps=2)
  assert scanned['flops_per_img'] == pytest.approx(per_image, rel=0.01)
  # The profile: every transformer component has kernels and time; the matmul and convolution
  # FLOPs it finds are most of XLA's total for the step and never more.
  prof = result['profile']
  rows = {(r['phase'], r['component']): r for r in prof['rows']}
  phases = ('forward', 'backward') if mode == 'train' else ('forward',)
  for phase in phases:
    for component in ('q/k/v projections', 'attention core (QK, softmax, AV)', 'MLP Dense_0',
                      'MLP Dense_1', 'LayerNorm'):
      assert rows[(phase, component)]['ms_per_step'] > 0, (phase, component)
  assert prof['kernel_ms_per_step'] == pytest.approx(sum(r['ms_per_step'] for r in prof['rows']))
  matmul_flops = 1e9 * sum(r['gflop_per_step'] for r in prof['rows'])
  assert 0.8 * per_image * 8 < matmul_flops <= per_image * 8  # 0.91 train, 0.93 infer
  # By kernel class: every kernel in one class, the step's parts each in theirs.
  assert prof['source'] == 'XLA:CPU kernels'
  assert sum(prof['classes'].values()) == pytest.approx(prof['kernel_ms_per_step'])
  assert set(prof['classes']) == set(profile.KERNEL_CLASSES)
  present = {c for c, t in prof['classes'].items() if t > 0}
  expected = {'GEMM', 'attention', 'LayerNorm', 'GELU and other elementwise'}
  assert expected | ({'optimizer', 'softmax'} if mode == 'train' else set()) <= present, present
  assert not present & ({'optimizer'} if mode == 'infer' else set())
  assert prof['top'][0][2] == max(t for _, _, t in prof['top'])
  table = compare.format_result(result)
  assert 'by kernel class (ms per step):\n| kernel class | ours ms |\n' in table


def test_input_pipeline_and_cli_json(tmp_path, data_dir):
  result = compare.run_benchmark(mnist5k.get_config(), model='ViT-Ze/4', batch_size=16,
                                 image_size=28, mode='input', dtype='float32', steps=5,
                                 input_data='mnist5k', data_dir=data_dir)
  assert result['img_per_s'] > 0 and result['input_data'] == 'mnist5k'
  # Outside the checkout: the default config is the package's; its dtype override is honoured.
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'bench', '--model=ViT-Ze/4', '--image_size=28',
       '--batch_size=8', '--steps=2', '--mode=infer', '--config.model.dtype=bfloat16', '--json'],
      cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout)
  assert all(result[f] > 0 for f in FIELDS)
  assert result['dtype'] == 'bfloat16'
  assert result['processor']['model_name'] and result['processor']['cpus'] >= 1


def test_matmul_shapes_are_one_vit_layers():
  """benchmarks/matmul_shapes.py: the shapes of one ViT-Ti/16 layer at batch 32, 224 px, and
  their FLOPs (the shapes the script times)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from benchmarks import matmul_shapes  # pylint: disable=g-import-not-at-top
  got = {name: (spec, lhs, rhs) for name, spec, lhs, rhs in
         matmul_shapes.shapes('ViT-Ti/16', 32, 224)}
  assert got['dense x W (q/k/v, out)'] == ('rd,df->rf', (6304, 192), (192, 192))
  assert got['MLP x^T dy (kernel grad)'] == ('rd,rf->df', (6304, 192), (6304, 768))
  assert got['attention Q K^T'] == ('bqd,bkd->bqk', (96, 197, 64), (96, 197, 64))
  assert got['attention weights^T dY'] == ('bqk,bqd->bkd', (96, 197, 197), (96, 197, 64))
  assert matmul_shapes.flops(*got['MLP x^T dy (kernel grad)']) == 2 * 6304 * 192 * 768
  assert matmul_shapes.flops(*got['attention weights^T dY']) == 2 * 96 * 197 * 197 * 64
  with pytest.raises(app.UsageError, match='is not a plain ViT'):
    matmul_shapes.shapes('R50+ViT-B/16', 8, 224)
  with pytest.raises(app.UsageError, match='is not a plain ViT'):
    matmul_shapes.shapes('BiT-R50x1', 8, 224)


def test_the_gpu_session_script_runs_its_steps_here(tmp_path):
  """benchmarks/gpu_session.sh with SUITE=smoke on this CPU, narrowed to one fp8 train run (timed
  and profiled, fp8 emulated) and a 10-step fp8 curve: the files a GPU machine sends back. On a
  machine without an NVIDIA GPU its GPU steps are one line."""
  out = tmp_path / 'out'
  env = dict(os.environ, SUITE='smoke', OUT=str(out), PYTHON=sys.executable, DEADLINE='100000',
             RUN_TIMEOUT='900', CURVE_TIMEOUT='900', TRAIN='Ze/4-train-ours-einsum+fp8', INFER='',
             CURVE_STEPS='10')
  proc = subprocess.run(['bash', 'benchmarks/gpu_session.sh'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert sorted(os.listdir(out)) == ['fp8_curve.jsonl', 'log.txt', 'train.json']
  (row,) = json.loads((out / 'train.json').read_text())['rows']
  assert row['id'] == 'Ze/4-train-ours-einsum+fp8' and row['ok'], row
  assert row['profile']['classes']['GEMM'] > 0 and row['versions']['jax']
  (curve,) = map(json.loads, (out / 'fp8_curve.jsonl').read_text().splitlines())
  assert [r['run'] for r in curve['runs']] == ['bf16', 'fp8']
  assert curve['runs'][0]['steps'] == curve['runs'][1]['steps'] == [5, 10]
  assert 0 < curve['max_abs_diff'] < 0.1, curve
  log = (out / 'log.txt').read_text()
  assert 'ms per step by kernel class' in log and '| step | bf16 loss | fp8 loss |' in log
  assert log.rstrip().splitlines()[-1].startswith('== done')
  env.update(SUITE='gpu')
  proc = subprocess.run(['bash', 'benchmarks/gpu_session.sh'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stderr.startswith(
      'error: benchmarks/gpu_session.sh runs on a machine with an NVIDIA GPU and this one has none')
  assert len(proc.stderr.splitlines()) == 1
