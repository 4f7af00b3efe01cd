"""Compiling for devices that are not here (vit_jax/platform/targets.py) on this CPU machine: TPU
slices with the TPU compiler (libtpu) and NVIDIA GPUs with XLA:GPU's compiler: target names,
per-device memory under every strategy, the one-line refusals (no compiler, unknown target, does
not fit), and XLA:CPU's report saying whose figures it gives.

libtpu comes from `make tpu-compiler`, the GPU compiler from `make gpu-compiler` (`make test`
runs both): these tests fail, not skip, without them.
"""

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from vit_jax.configs import common
from vit_jax.configs import mnist5k
from vit_jax import models
from vit_jax.models import cost
from vit_jax.errors import UserError
from vit_jax.parallel import memory
from vit_jax.platform import chips
from vit_jax.platform import targets
from vit_jax.train import loop
from vit_jax.train import program
from helpers import ROOT

# One worker runs this module, so its shared fixtures are computed once per test run.
pytestmark = pytest.mark.xdist_group('compile_targets')

GIB = 2 ** 30


@pytest.mark.parametrize('name, topology, devices, hbm_gib, accelerator', [
    ('v3-8', 'v3:2x2', 8, 16, 'v3-8'),
    ('v3-32', 'v3:4x4', 32, 16, 'v3-32'),
    ('v3-64', 'v3:4x8', 64, 16, 'v3-64'),
    ('v3-256', 'v3:8x16', 256, 16, 'v3-256'),
    ('v3-512', 'v3:16x16', 512, 16, 'v3-512'),
    ('v2-8', 'v2:2x2', 8, 8, 'v2-8'),
    ('v4-8', 'v4:2x2x1', 4, 32, 'v4-8'),
    ('v4-16', 'v4:2x2x2', 8, 32, 'v4-16'),
    ('v4-32', 'v4:2x2x4', 16, 32, 'v4-32'),
    ('v4-128', 'v4:4x4x4', 64, 32, 'v4-128'),
    ('v5p-256', 'v5p:4x4x8', 128, 95, 'v5p-256'),
    ('v5litepod-16', 'v5e:4x4', 16, 16, 'v5litepod-16'),
    ('v5e-8', 'v5e:2x4', 8, 16, 'v5litepod-8'),
    ('v6e-8', 'v6e:2x4', 8, 32, 'v6e-8'),
    ('V3:4X4', 'v3:4x4', 32, 16, 'v3-32'),
])
def test_slice_names_decode_to_topologies(name, topology, devices, hbm_gib, accelerator):
  spec = targets.parse(name)
  assert (spec.topology, spec.num_devices, spec.hbm_bytes) == (topology, devices, hbm_gib * GIB)
  assert spec.accelerator_type == accelerator and spec.platform == 'tpu'


@pytest.mark.parametrize('name, needle', [
    ('v3-7', 'must be a power of two from 8'),
    ('v3-12', 'must be a power of two from 8'),
    ('v4-4', 'must be a power of two from 8'),
    ('v9-8', "unknown compile target 'v9-8'"),
    ('tpu', "unknown compile target 'tpu'"),
    ('v3:2y2', "unknown compile target 'v3:2y2'"),
    ('a100', "unknown compile target 'a100' .* or an NVIDIA GPU \\(h100, h200\\)"),
])
def test_unknown_targets_are_one_line(name, needle):
  with pytest.raises(UserError, match=needle) as info:
    targets.parse(name)
  message = str(info.value)
  assert '\n' not in message
  # It names valid slices, and they decode.
  suggested = message.split('e.g. ')[1].split(', ')[:2] if 'e.g. ' in message else ['v3-8']
  assert all(targets.parse(s.strip(')')).num_devices for s in suggested)


def test_missing_libtpu_says_how_to_install(monkeypatch, tmp_path):
  monkeypatch.delenv('TPU_LIBRARY_PATH', raising=False)
  monkeypatch.setattr(sys, 'prefix', str(tmp_path))
  monkeypatch.setitem(sys.modules, 'libtpu', None)  # `import libtpu` raises ImportError
  with pytest.raises(UserError, match=r'needs libtpu.*make tpu-compiler'):
    targets.find_libtpu()


def test_libtpu_is_installed_for_the_suite():
  """`make test` installs the TPU compiler; without it the TPU tests below would be void."""
  assert targets.find_libtpu().endswith('libtpu.so')


def _config(**overrides):
  c = mnist5k.get_config('model_name=ViT-Mu/4,steps=1000,batch_size=64')
  c.dataset, c.num_classes = 'imagenet2012', 1000
  common.rgb_input(c)
  c.data_dir = '/nonexistent/tfds'  # not prepared anywhere: compile-only needs no data
  c.compile_for = 'v3-8'
  # 2 of Mu/4's 6 layers: every kind of parameter, about half the compile time.
  c.model.num_layers = 2
  common.apply(c, overrides)
  return c


def _model(config):
  return models.create_model(config.model_name, num_classes=config.num_classes,
                             num_layers=config.model.num_layers)


STRATEGIES = {
    'data parallel': {},
    'fsdp': {'mesh.data': 1, 'mesh.fsdp': -1},
    'data x model': {'mesh.data': 4, 'mesh.model': 2},
    'pmap': {'parallelism': 'pmap'},
}


@pytest.fixture(scope='module')
def tpu_reports(tmp_path_factory):
  """{strategy: (report, printed text)}, compiled once for the module."""
  workdir = str(tmp_path_factory.mktemp('plan') / 'w')
  reports = {}
  for name, overrides in STRATEGIES.items():
    with contextlib.redirect_stdout(io.StringIO()) as out:
      reports[name] = (loop.train_and_evaluate(_config(**overrides), workdir), out.getvalue())
  assert not os.path.exists(workdir)  # nothing written
  return reports


def test_every_strategy_compiles_for_a_v3_slice(tpu_reports):
  for name, (report, _) in tpu_reports.items():
    assert report['platform'] == 'tpu' and report['devices'] == 8, name
    assert report['device_kind'] == '8 x TPU v3' and report['hbm_bytes'] == 16 * GIB, name
    assert memory.fits(report) is True, name
    state = report['param_bytes'] + report['opt_state_bytes']
    # The TPU's arguments are the state shard plus the batch shard (8 images of 28x28x3 per
    # core), laid out in the TPU's tiles, so never less than the raw bytes.
    assert report['argument_bytes'] >= state + 8 * 28 * 28 * 3 * 4, name
    assert report['alias_bytes'] >= state * 0.9, name  # the donated state is reused
    assert report['flops'] > 0 and report['eval']['flops'] > 0, name
    assert report['compile_seconds'] > 0 and report['eval']['compile_seconds'] > 0, name


def test_fsdp_and_tensor_parallel_split_the_state_on_tpu(tpu_reports):
  dp, fsdp, tp, pmap = (tpu_reports[k][0] for k in STRATEGIES)
  # FSDP splits every parameter of >= 4096 elements 8 ways (the Mu/4 kernels and head; norms,
  # biases, cls stay); tensor parallelism halves the attention and MLP kernels.
  assert fsdp['param_bytes'] < dp['param_bytes'] / 5
  assert dp['param_bytes'] / 2 < tp['param_bytes'] < dp['param_bytes'] * 0.75
  assert fsdp['argument_bytes'] < dp['argument_bytes'] / 2
  # The pmap path holds the same replicated state as data parallelism under jit.
  assert pmap['param_bytes'] == dp['param_bytes']


def test_report_names_the_tpu_compiler_and_the_fit(tpu_reports):
  out = tpu_reports['data parallel'][1]
  assert out.startswith('compile-only: ViT-Mu/4 at 28 px, batch 64, jit, mesh data 8 x fsdp 1')
  assert ('compiled by the TPU compiler for v3-8 (TPU v3, topology v3:2x2, 8 cores, 16 GiB HBM '
          'per core)') in out
  assert 'fits: peak 0.0' in out and 'GiB of the 16 GiB HBM per device' in out
  assert 'XLA:CPU' not in out


def test_report_says_how_long_with_the_pallas_calls_costed(tpu_reports):
  """`auto` attention is the splash (Pallas) kernel on TPU, which the cost model does not cost:
  its matmuls are added from the model's shapes, and the plan says so."""
  report, out = tpu_reports['data parallel']
  train, evaluate = report['estimate']['train'], report['estimate']['eval']
  model = _model(_config())
  attention = cost.attention_flops(model, (28, 28, 3))
  assert report['custom_calls'] > 0 and report['eval']['custom_calls'] > 0
  assert train['uncosted_flops'] == pytest.approx(3 * attention * 64 / 8)
  assert evaluate['uncosted_flops'] == pytest.approx(attention * 200 / 8)
  assert train['seconds'] > report['optimal_seconds'] > 0
  assert 0 < train['utilisation'] < 1 and 0 < evaluate['utilisation'] < 1
  assert report['estimate']['steps'] == 1000
  assert report['estimate']['run_seconds'] == pytest.approx(1000 * train['seconds'])
  assert "estimated by the TPU compiler's cost model (a lower bound): train step " in out
  assert re.search(r'estimated run: 1,000 train steps x [\d.]+ ms = [\d.]+ (ms|s) of train steps',
                   out)
  assert 'note: the cost model does not cost the ' in out and 'Pallas calls (splash attention) '\
      'of the train step' in out


# One slice of each TPU generation `config.compile_for` names (targets.TPU_EXAMPLES): v4 and v5p
# chips are megacore (one device of two cores), v5e and v6e slices of one chip are smaller than
# a host.
GENERATIONS = {'v3': 'v3-8', 'v4': 'v4-8', 'v5e': 'v5litepod-1', 'v5p': 'v5p-8', 'v6e': 'v6e-1'}
PER_DEVICE_BATCH = 32


@pytest.mark.parametrize('generation', sorted(GENERATIONS))
def test_every_generation_compiles_with_an_estimate(generation):
  """A one-block ViT-B/8 at 32 px (17 tokens) train step for each generation: the devices are
  the compiler's own, its FLOPs are the analytic count's (matmuls dominate at this width), and
  its estimate is a positive time below the chip's peak, also on v4, v5e and v6e, where the cost
  model's own total is negative from its -1 s per ConcatBitcast."""
  name = GENERATIONS[generation]
  target = targets.parse(name)
  config = _config(compile_for=name, model_name='ViT-B/8', image_size=32, num_classes=10,
                   batch_size=PER_DEVICE_BATCH * target.num_devices,
                   eval_batch_size=target.num_devices, **{'model.num_layers': 1,
                                                          'model.attention': 'einsum'})
  prog = program.build_program(config)
  assert prog.target.chip.target == generation and prog.mesh.devices.size == target.num_devices
  compiled = prog.train_fn.lower(*prog.abstract_train_args()).compile()
  stats = dict(memory.step_stats(compiled, 0.0), devices=target.num_devices)
  analytic = cost.train_flops(prog.model, prog.image_shape) * PER_DEVICE_BATCH
  assert stats['flops'] == pytest.approx(analytic, rel=0.02)
  assert stats['custom_calls'] == 0  # einsum attention: everything is costed
  train = prog.estimate(stats)['train']
  # The cost model's own total is negative exactly where the program holds ConcatBitcasts.
  assert (stats['optimal_seconds'] < 0) == (stats['concat_bitcasts'] > 0)
  assert stats['optimal_seconds'] == pytest.approx(train['seconds'] - stats['concat_bitcasts'])
  assert 0 < train['seconds'] < 1 and 0 < train['utilisation'] < 1
  assert train['images_per_second_per_chip'] == pytest.approx(
      PER_DEVICE_BATCH * target.chip.slices.devices_per_chip / train['seconds'])


def test_a_batch_that_does_not_split_names_the_sizes_that_do():
  """The default config's eval batch over a v5litepod-16, found before anything compiles; the
  sizes it names split."""
  config = _config(compile_for='v5litepod-16', batch_size=64)
  with pytest.raises(UserError, match=r'^eval_batch_size=200 does not split over 16 devices in 1 '
                     r'processes: use a multiple of 16, e\.g\. config\.eval_batch_size=192 or '
                     r'208$'):
    program.check_placement(config)
  for size in (192, 208):
    assert program.check_placement(_config(compile_for='v5litepod-16', batch_size=64,
                                           eval_batch_size=size)).mesh.devices.size == 16


def test_cpu_report_says_it_is_not_a_tpu_figure(tmp_path, capsys):
  report = loop.train_and_evaluate(_config(compile_for='', compile_only=True), str(tmp_path / 'w'))
  out = capsys.readouterr().out
  assert report['platform'] == 'cpu' and report['hbm_bytes'] is None
  assert 'compiled by XLA:CPU for 8 x cpu' in out
  assert "note: XLA:CPU's figures, not a TPU's" in out and 'compile_for=v3-8' in out


def test_a_config_that_cannot_fit_says_so_in_one_line():
  """ViT-Ze/4 at 224 px has 3,137 tokens: 1,024 images per core are far beyond a v3 core's HBM,
  even with the flash kernel that `auto` picks on TPU (256 per core took 13.2 GiB)."""
  command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py',
             '--workdir=/nonexistent/never-written', '--config.compile_for=v3-8',
             '--config.model_name=ViT-Ze/4', '--config.image_size=224',
             '--config.batch_size=8192', '--config.num_classes=10',
             '--config.pp.train=pad_crop(pad=2)|channels(3)', '--config.pp.eval=resize|channels(3)',
             '--config.dataset=imagenet2012', '--config.data_dir=/nonexistent/tfds']
  env = dict(os.environ, VIT_JAX_HUGEPAGES='0')
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr  # libtpu's start-up log is not shown either
  assert lines[0].startswith('error: does not fit: ViT-Ze/4 at 224 px, batch 8192')
  assert 'the TPU compiler ran out of HBM' in lines[0] and '--config.model.remat=full' in lines[0]
  assert 'is available per device' in lines[0]


def test_gpu_names_decode_to_one_device_of_the_chip_table():
  for name, kind, memory_bytes in (('h100', 'NVIDIA H100 80GB HBM3', 84_978_434_048),
                                   ('H200', 'NVIDIA H200', 150_754_820_096)):
    target = targets.parse(name)
    assert (target.platform, target.num_devices, target.topology) == ('gpu', 1, '1x1x1')
    assert target.chip is chips.find_chip(kind) and target.hbm_bytes == memory_bytes
    # What the compiler is told is the table's row: its kind, memory, bandwidth and SMs.
    config = targets.gpu_target_config(target.chip)
    assert f'device_description_str: "{kind}"' in config
    fields = dict(re.findall(r'(\w+): (\d+)', config))
    assert fields['device_memory_size'] == str(memory_bytes) and fields['core_count'] == '132'
    assert fields['memory_bandwidth'] == str(int(target.chip.hbm_bytes_per_s))
  assert targets.compiler_options(targets.parse('h100')) == {
      'xla_gpu_enable_triton_gemm': False, 'xla_gpu_autotune_level': 0}
  assert targets.compiler_options(targets.parse('v3-8')) is None
  assert targets.compiler_options(None) is None


def test_missing_gpu_compiler_says_how_to_install(tmp_path):
  with pytest.raises(UserError) as info:
    targets.load_gpu_compiler(str(tmp_path))
  assert str(info.value) == (
      f'compiling for an NVIDIA GPU without one needs the XLA:GPU compiler, which is not '
      f'installed in {tmp_path}: run `make gpu-compiler` once (it installs it into '
      f'.venv/gpu-compiler)')
  (tmp_path / 'jax_plugins').mkdir()  # a folder without the plugin is no compiler either
  with pytest.raises(UserError, match='needs the XLA:GPU compiler'):
    targets.load_gpu_compiler(str(tmp_path))


@pytest.fixture(scope='module')
def gpu_report(tmp_path_factory):
  """The trainer's compile-only report for one H100, bf16 (auto attention), and what it printed."""
  workdir = str(tmp_path_factory.mktemp('gpu') / 'w')
  with contextlib.redirect_stdout(io.StringIO()) as out:
    report = loop.train_and_evaluate(
        _config(compile_for='h100', **{'model.dtype': 'bfloat16'}), workdir)
  assert not os.path.exists(workdir)  # nothing written
  return report, out.getvalue()


def test_the_trainer_compiles_for_a_gpu_that_is_not_here(gpu_report):
  """`config.compile_for=h100`: XLA:GPU's memory analysis of the train and eval steps for one
  H100, from this CPU machine; the persistent cache is left alone (compile-only devices)."""
  report, out = gpu_report
  assert (report['platform'], report['devices']) == ('gpu', 1)
  assert report['device_kind'] == '1 x NVIDIA H100 80GB HBM3'
  assert report['hbm_bytes'] == 84_978_434_048 and memory.fits(report) is True
  state = report['param_bytes'] + report['opt_state_bytes']
  # The whole batch (64 images of 28x28x3, float32) and the state are the step's arguments.
  assert report['argument_bytes'] >= state + 64 * 28 * 28 * 3 * 4
  assert report['alias_bytes'] >= state * 0.9  # the donated state is reused
  assert report['temp_bytes'] > 0 and report['eval']['peak_bytes'] > 0
  assert report['flops'] is None  # XLA:GPU's count misses the cuBLAS GEMMs: not shown
  assert out.startswith('compile-only: ViT-Mu/4 at 28 px, batch 64, jit, mesh data 1 x fsdp 1')
  assert ('compiled by XLA:GPU for h100 (NVIDIA H100 80GB HBM3, 79.14 GiB; compiled without the '
          'GPU: no autotuning, cuBLAS GEMMs)') in out
  assert 'GiB of the 79.14 GiB HBM per device' in out and 'XLA:CPU' not in out
  assert "FLOPs not counted (XLA:GPU's cost analysis does not see the cuBLAS" in out


@pytest.mark.slow
@pytest.mark.parametrize('command', [
    ['vit_jax', 'bench', '--compile_for=h100', '--model=ViT-Ti/16'],
    ['vit_jax.main', '--config=configs/default.py', '--workdir=/nonexistent/never-written',
     '--config.compile_for=h100'],
], ids=['bench', 'train'])
def test_compile_for_a_gpu_without_the_compiler_is_one_line(tmp_path, command):
  proc = subprocess.run(
      [sys.executable, '-m', *command],
      env={**os.environ, 'VIT_JAX_GPU_COMPILER': str(tmp_path / 'none'), 'VIT_JAX_HUGEPAGES': '0'},
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f'error: compiling for an NVIDIA GPU without one needs the XLA:GPU compiler, which is not '
      f'installed in {tmp_path / "none"}: run `make gpu-compiler` once (it installs it into '
      f'.venv/gpu-compiler)']
