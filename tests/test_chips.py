"""The chip table and device line (vit_jax/platform/chips.py), the GPU probe, install hint and
XLA:GPU flag variants (vit_jax/platform/gpu.py), and MFU in the trainer's log (run/logs.py).
Compiling for the chips that are not here: tests/test_compile_targets.py."""

import collections
import os
import subprocess
import sys
import types

import jax
import pytest

from vit_jax.errors import UserError
from vit_jax.models import cost
from vit_jax.models import create_model
from vit_jax.platform import chips
from vit_jax.platform import gpu
from vit_jax.run import logs
from helpers import ROOT

Device = collections.namedtuple('Device', 'platform device_kind')


@pytest.mark.parametrize('kind, name, bf16', [
    ('NVIDIA H200', 'H200', 989.5e12), ('NVIDIA H100 80GB HBM3', 'H100 SXM', 989.5e12),
    ('NVIDIA H100 PCIe', 'H100 PCIe', 756e12), ('NVIDIA A100-SXM4-80GB', 'A100 80GB', 312e12),
    ('NVIDIA A100-SXM4-40GB', 'A100 40GB', 312e12), ('NVIDIA L4', 'L4', 121e12),
    ('TPU v3', 'TPU v3 (per core)', 61.5e12), ('TPU v4', 'TPU v4', 275e12),
    ('TPU v5 lite', 'TPU v5e', 197e12), ('TPU v5', 'TPU v5p', 459e12),
    ('TPU v6 lite', 'TPU v6e', 918e12)])
def test_device_kinds_find_their_chip(kind, name, bf16):
  chip = chips.find_chip(kind)
  assert chip.name == name and chip.bf16_flops == bf16
  assert chips.datasheet_peak(kind, 'bfloat16') == bf16
  assert chips.datasheet_peak(kind, 'float32') == chip.fp32_flops <= bf16


def test_unknown_chips_and_cpus_use_the_measured_rate():
  assert chips.find_chip('cpu') is None and chips.find_chip('NVIDIA GeForce GT 710') is None
  measured = []
  peak, source = chips.peak_flops([Device('cpu', 'cpu')] * 8, 'float32',
                                  measure=lambda d: measured.append(d) or 5e10)
  assert (peak, measured) == (5e10, ['float32']) and 'measured' in source
  peak, source = chips.peak_flops([Device('gpu', 'NVIDIA H200')] * 2, 'bfloat16',
                                  measure=lambda d: pytest.fail('a known chip is not measured'))
  assert peak == 2 * 989.5e12 and source == 'H200 datasheet, bfloat16'
  # The measurement itself: a positive rate on this CPU.
  assert chips.measure_matmul_flops(size=256, repeats=2) > 1e8


def test_the_device_line_names_count_and_kind_and_the_missing_gpu_build():
  assert chips.describe_devices(jax.devices(), gpu_probe=lambda: False) == '8 x cpu'
  assert chips.describe_devices([Device('gpu', 'NVIDIA H200')]) == '1 x NVIDIA H200'
  assert (chips.describe_devices([Device('tpu', 'TPU v4')] * 2 + [Device('cpu', 'cpu')])
          == '2 x TPU v4 + 1 x cpu')
  # An NVIDIA driver here, JAX on the CPU without its CUDA build: how to install it.
  line = chips.describe_devices(jax.devices(), gpu_probe=lambda: True,
                                cuda_installed=lambda: False)
  assert line.startswith('8 x cpu (') and 'make install ACCEL=cuda13' in line and '\n' not in line
  # With the CUDA build installed, the CPU was chosen (JAX_PLATFORMS=cpu): nothing to say.
  assert chips.describe_devices(jax.devices(), gpu_probe=lambda: True,
                                cuda_installed=lambda: True) == '8 x cpu'


def test_the_gpu_probe_reads_the_driver_entry_and_nvidia_smi(tmp_path):
  missing = str(tmp_path / 'nothing')
  assert not gpu.nvidia_gpu_present(proc=missing, which=lambda name: None)
  assert gpu.nvidia_gpu_present(proc=str(tmp_path), which=lambda name: None)
  assert gpu.nvidia_gpu_present(proc=missing, which=lambda name: '/usr/bin/' + name)
  assert gpu.cuda_jax_installed(find_spec=lambda name: object() if 'cuda13' in name else None)
  assert not gpu.cuda_jax_installed(find_spec=lambda name: None)
  assert not gpu.cuda_jax_installed()  # this machine runs the CPU build
  # The compiler-only plugin of `make gpu-compiler` (on the import path after a compile for a
  # GPU) is no CUDA build of JAX.
  compiler = tmp_path / 'gpu-compiler'
  spec = lambda name: types.SimpleNamespace(origin=str(compiler / name / '__init__.py'))
  assert not gpu.cuda_jax_installed(find_spec=spec, compiler_dir=str(compiler))
  assert gpu.cuda_jax_installed(find_spec=spec, compiler_dir=str(tmp_path / 'elsewhere'))


def test_xla_gpu_flag_variants():
  for name, (flags, purpose) in gpu.XLA_GPU_FLAGS.items():
    assert purpose and all(f.startswith('--xla_gpu_') for f in flags), name
  assert gpu.variant_flags(gpu.DEFAULT_VARIANT) == ()
  with pytest.raises(UserError, match='unknown XLA:GPU flag variant .*latency_hiding'):
    gpu.variant_flags('fast')


@pytest.mark.slow
def test_every_xla_gpu_flag_is_one_xla_knows():
  """XLA aborts on an unknown flag in XLA_FLAGS (whatever the backend): each variant starts."""
  flags = ' '.join(f for v in gpu.XLA_GPU_FLAGS for f in gpu.variant_flags(v))
  proc = subprocess.run([sys.executable, '-c', 'import jax; print(jax.numpy.ones(3).sum())'],
                        env={**os.environ, 'XLA_FLAGS': flags}, capture_output=True, text=True,
                        cwd=ROOT, timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == '3.0', proc.stderr[-2000:]


def test_throughput_gives_img_per_s_and_mfu_between_train_records():
  now = [0.]
  t = logs.Throughput(batch_size=32, flops_per_image=1e9, peak_flops=1e12, clock=lambda: now[0])
  now[0] = 50.
  assert t.measure(10) == {}  # the first record: its time holds the compilation
  now[0] = 60.
  got = t.measure(20)  # 10 steps x 32 images in 10 s
  assert got['img_per_s'] == pytest.approx(32.) and got['mfu'] == pytest.approx(32e9 / 1e12)
  now[0] = 100.
  t.mark(20)  # an evaluation took 40 s: not counted
  now[0] = 105.
  assert t.measure(30)['img_per_s'] == pytest.approx(64.)


def test_the_metric_log_carries_mfu(tmp_path):
  now = [0.]
  t = logs.Throughput(batch_size=8, flops_per_image=2e9, peak_flops=1e12, clock=lambda: now[0])
  logger = logs.MetricLogger(str(tmp_path), enabled=True, throughput=t)
  for step, split, clock in ((5, 'train', 30.), (10, 'train', 31.), (10, 'eval', 40.),
                             (15, 'train', 42.)):
    now[0] = clock
    logger.write(step, split, {'loss': 1.0})
  logger.close()
  records = logs.read_metrics(logs.metrics_path(str(tmp_path)))
  assert 'mfu' not in records[0] and 'mfu' not in records[2]
  assert records[1]['img_per_s'] == pytest.approx(40.) and records[1]['mfu'] == pytest.approx(0.08)
  assert records[3]['img_per_s'] == pytest.approx(20.)


def test_throughput_for_a_run_counts_the_models_train_flops():
  model = create_model('ViT-Ze/4', num_classes=10)
  t = logs.throughput_for(model, (28, 28, 1), 16, jax.devices(), 'float32')
  assert t.flops_per_image == cost.train_flops(model, (28, 28, 1))
  assert t.peak_flops > 1e8  # this CPU's measured matmul rate


def test_the_table_holds_what_compiling_for_a_chip_needs():
  """One row per chip: the TPUs `compile_for` names carry their slice shapes, the GPUs it names
  their multiprocessors; each row's own device_kind finds the row; memory per device."""
  for chip in chips.CHIPS:
    assert chips.find_chip(chip.kind) is chip, chip.name
  tpus, gpus = chips.compile_targets('tpu'), chips.compile_targets('gpu')
  assert [c.target for c in tpus] == ['v2', 'v3', 'v4', 'v5e', 'v5p', 'v6e']
  assert all(c.slices is not None and c.sm_count is None for c in tpus)
  assert sorted(c.target for c in gpus) == ['h100', 'h200']
  assert all(c.sm_count == 132 and c.slices is None for c in gpus)
  assert chips.hbm_bytes([Device('tpu', 'TPU v3')] * 8) == 16 * 2 ** 30
  assert chips.hbm_bytes([Device('gpu', 'NVIDIA H100 80GB HBM3')]) == 84_978_434_048
  assert chips.hbm_bytes(jax.devices()) is None  # a CPU: no table entry
