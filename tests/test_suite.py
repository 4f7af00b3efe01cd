"""`bench --suite` (vit_jax/tools/benchmarking/suite.py): the plan, the commands and the table as pure
functions, and the smoke suite run end to end on this CPU (each run in its own process)."""

import json
import subprocess
import sys

import pytest

from vit_jax.tools.benchmarking import suite
from vit_jax.errors import UserError
from helpers import ROOT


def _ids(runs):
  return [r.id for r in runs]


def test_the_gpu_plan_times_three_models_both_modes_and_every_side():
  runs = suite.plan('gpu', compare='timm')
  assert len(runs) == 3 * (7 + 4)  # the remat and fp8 variants in train only
  assert _ids(runs)[:11] == [
      'Ti/16-train-ours-einsum', 'Ti/16-train-ours-cudnn', 'Ti/16-train-ours-einsum:dots',
      'Ti/16-train-ours-cudnn:dots', 'Ti/16-train-ours-cudnn+fp8', 'Ti/16-train-timm-eager',
      'Ti/16-train-timm-compiled', 'Ti/16-infer-ours-einsum', 'Ti/16-infer-ours-cudnn',
      'Ti/16-infer-timm-eager', 'Ti/16-infer-timm-compiled']
  assert {(r.model, r.batch) for r in runs} == {('ViT-Ti/16', 256), ('ViT-B/16', 256),
                                                ('ViT-L/16', 128)}
  # Without --compare=timm: ours only.
  assert {r.side for r in suite.plan('gpu')} == {'ours'}


def test_the_plan_narrows_to_a_subset_and_adds_xla_variants():
  runs = suite.plan('gpu', compare='timm', models=['B/16'], modes=['train'],
                    sides=['ours-einsum', 'timm-compiled'], xla=['latency_hiding', 'autotune_0'])
  assert _ids(runs) == ['B/16-train-ours-einsum', 'B/16-train-ours-einsum+xla:latency_hiding',
                        'B/16-train-ours-einsum+xla:autotune_0', 'B/16-train-timm-compiled']
  only = ['B/16-infer-ours-einsum', 'L/16-train-timm-compiled']
  assert _ids(suite.plan('gpu', compare='timm', models=['ViT-B/16', 'L/16'], only=only)) == only
  # A variant alone, without its base run.
  only = ['B/16-train-ours-einsum+xla:no_command_buffers']
  assert _ids(suite.plan('gpu', xla=['no_command_buffers'], only=only)) == only


@pytest.mark.parametrize('kwargs, match', [
    (dict(models=['B/14']), 'unknown --suite_models ViT-B/14: use some of ViT-Ti/16'),
    (dict(modes=['eval']), 'unknown --suite_modes eval'),
    (dict(sides=['timm-jit']), 'unknown --suite_sides timm-jit'),
    (dict(xla=['fast']), 'unknown --suite_xla fast'),
    (dict(only=['B/16-train']), 'unknown --suite_only B/16-train'),
    (dict(sides=['timm-eager']), 'leave no run'),  # timm without --compare=timm
])
def test_bad_subsets_are_one_line_errors(kwargs, match):
  with pytest.raises(UserError, match=match) as err:
    suite.plan('gpu', **kwargs)
  assert '\n' not in str(err.value)
  with pytest.raises(UserError, match='unknown --suite=tpu'):
    suite.plan('tpu')


def test_each_run_has_its_command_and_flags():
  ours, flagged, timm = suite.plan('gpu', compare='timm', models=['B/16'], modes=['train'],
                                   sides=['ours-einsum', 'timm-compiled'],
                                   xla=['no_triton_gemm'])
  argv, env = suite.command(ours, 'gpu', python='py')
  assert argv == ['py', '-m', 'vit_jax', 'bench', '--model=ViT-B/16', '--batch_size=256',
                  '--image_size=224', '--mode=train', '--dtype=bfloat16', '--steps=20', '--json',
                  '--config.model.attention=einsum'] and env == {}
  dots, = suite.plan('gpu', only=['L/16-train-ours-einsum:dots'])
  argv, _ = suite.command(dots, 'gpu', python='py')
  assert argv[-2:] == ['--config.model.attention=einsum', '--config.model.remat=dots']
  fp8, = suite.plan('gpu', only=['B/16-train-ours-cudnn+fp8'])
  argv, _ = suite.command(fp8, 'gpu', python='py', profile=True)
  assert argv[-3:] == ['--config.model.attention=cudnn', '--config.model.fp8=true', '--profile']
  argv, env = suite.command(flagged, 'gpu', python='py', steps=5)
  assert '--steps=5' in argv and env['XLA_FLAGS'].endswith('--xla_gpu_enable_triton_gemm=false')
  _, env = suite.command(ours, 'gpu', python='py', dump_to='/out/dump')
  assert env['XLA_FLAGS'].split()[-3:] == [
      '--xla_dump_to=/out/dump/B_16-train-ours-einsum', '--xla_dump_hlo_as_text',
      f'--xla_dump_hlo_module_re={suite.TRAIN_STEP_MODULE}']
  argv, env = suite.command(timm, 'gpu', python='py', dump_to='/out/dump')
  assert argv[:3] == ['py', '-m', 'vit_jax.tools.benchmarking.timm_side']
  assert env == {'JAX_PLATFORMS': 'cpu'}  # JAX stays off the GPU timm runs on
  assert json.loads(argv[3]) == dict(model='ViT-B/16', batch_size=256, image_size=224,
                                     mode='train', compiled=True, steps=20, device='cuda',
                                     dtype='bfloat16')
  argv, _ = suite.command(timm, 'gpu', python='py', profile=True)
  assert json.loads(argv[3])['profile'] is True
  smoke, = suite.plan('smoke', compare='timm', only=['Ze/4-train-timm-eager'])
  assert json.loads(suite.command(smoke, 'smoke')[0][3])['device'] == 'cpu'  # timm on the CPU


def test_rows_and_the_table():
  ours, cudnn, timm = suite.plan('gpu', compare='timm', models=['B/16'], modes=['train'],
                                 sides=['ours-einsum', 'ours-cudnn', 'timm-compiled'])
  rows = [
      suite.row(ours, {'img_per_s': 2843.0, 'mfu': 0.302, 'peak_bytes': 29.1e9,
                       'device_peak_bytes': 30.2e9, 'compile_s': 39.5,
                       'device_kind': 'NVIDIA H200', 'flops_per_img': 105e9}),
      suite.row(cudnn, None, 'exit 1: RESOURCE_EXHAUSTED: out of memory'),
      suite.row(timm, {'img_per_s': 3440.0, 'mfu': 0.366, 'peak_bytes': 17.7e9, 'first_s': 21.0,
                       'device_name': 'NVIDIA H200', 'flops_per_img': 105e9})]
  assert [r['ok'] for r in rows] == [True, False, True]
  table = suite.format_table(rows).splitlines()
  assert table[0] == 'on NVIDIA H200:'
  assert table[2] == '| ' + ' | '.join(suite.COLUMNS) + ' |'
  assert table[4] == '| B/16-train-ours-einsum | 2,843 | 30.2% | 29.1 | 30.2 | 39.5 | 0.83 |'
  assert table[5].startswith('| B/16-train-ours-cudnn | failed: exit 1: RESOURCE_EXHAUSTED')
  assert table[6] == '| B/16-train-timm-compiled | 3,440 | 36.6% | - | 17.7 | 21.0 | 1.00 |'


def test_the_versions_head_the_table_and_profiles_line_up_by_kernel_class():
  ours, timm = suite.plan('gpu', compare='timm', models=['B/16'], modes=['train'],
                          sides=['ours-cudnn', 'timm-compiled'])
  classes = lambda **ms: {'classes': ms, 'kernel_ms_per_step': sum(ms.values())}
  rows = [
      suite.row(ours, {'img_per_s': 3354.0, 'compile_s': 46.6, 'device_kind': 'NVIDIA H200',
                       'step_s_all': [0.0765, 0.0763, 0.0770],
                       'versions': {'jax': '0.11.2', 'jax-cuda13-plugin': '0.11.2'},
                       'profile': classes(GEMM=40.0, attention=12.0, LayerNorm=5.5)}),
      suite.row(timm, {'img_per_s': 3524.0, 'first_s': 37.6, 'device_name': 'NVIDIA H200',
                       'step_s_all': [0.0727, 0.0726], 'versions': {'torch': '2.11.0'},
                       'profile': classes(GEMM=41.5, attention=10.0, softmax=0.5)})]
  assert suite.format_table(rows).splitlines()[0] == (
      'on NVIDIA H200 (jax 0.11.2, jax-cuda13-plugin 0.11.2; torch 2.11.0):')
  table = suite.format_profile_tables(rows).splitlines()
  assert table[0] == 'ViT-B/16 train, batch 256: ms per step by kernel class'
  assert table[1] == ('| kernel class | B/16-train-ours-cudnn ms | B/16-train-timm-compiled ms | '
                      'B/16-train-ours-cudnn - B/16-train-timm-compiled |')
  assert table[3:] == [
      '| GEMM | 40.00 | 41.50 | -1.50 |', '| attention | 12.00 | 10.00 | +2.00 |',
      '| LayerNorm | 5.50 | 0.00 | +5.50 |', '| softmax | 0.00 | 0.50 | -0.50 |',
      '| total kernel time | 57.50 | 52.00 | +5.50 |',
      'step wall time (median, ms): B/16-train-ours-cudnn 76.50, B/16-train-timm-compiled 72.65']


def test_a_failing_run_gives_its_line_and_a_slow_one_its_budget():
  result, reason = suite.execute([sys.executable, '-c', 'import sys; print("warning: x", '
                                  'file=sys.stderr); sys.exit("error: no GPU here")'], {}, 30)
  assert result is None and reason == 'exit 1: error: no GPU here'
  result, reason = suite.execute([sys.executable, '-c', 'import time; time.sleep(30)'], {}, 1)
  assert result is None and reason == 'timed out after 1 s (--suite_timeout)'
  result, _ = suite.execute([sys.executable, '-c', 'print("log line"); print(\'{"a": 1}\')'],
                            {}, 30)
  assert result == {'a': 1}


@pytest.mark.slow
def test_the_smoke_suite_runs_end_to_end(tmp_path):
  """Two runs of ViT-Ze/4 inference, each in its own process: einsum times, cudnn fails with
  its one line on this CPU and the suite goes on; --json writes the rows."""
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'bench', '--suite=smoke', '--suite_modes=infer',
       '--json'], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout)['rows']
  assert [(r['id'], r['ok']) for r in rows] == [('Ze/4-infer-ours-einsum', True),
                                                ('Ze/4-infer-ours-cudnn', False)]
  assert rows[0]['img_per_s'] > 0 and 0 < rows[0]['mfu'] < 1 and rows[0]['device'] == 'cpu'
  assert 'model.attention=cudnn is an NVIDIA GPU kernel' in rows[1]['reason']
  assert '| Ze/4-infer-ours-einsum |' in proc.stderr and 'on cpu:' in proc.stderr
  # The GPU suite on a machine without an NVIDIA GPU: one line, exit 2.
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'bench', '--suite=gpu'], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and proc.stderr.strip().startswith('error: --suite=gpu times on '
                                                                 'an NVIDIA GPU'), proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1
