"""The XLA flags the training commands set for themselves (vit_jax/xla_flags.py)."""

import os
import subprocess
import sys

import ml_collections
import pytest

from vit_jax import xla_flags

from helpers import ROOT

SCHEDULER = '--xla_cpu_enable_concurrency_optimized_scheduler'
MEMORY = xla_flags.SCHEDULES['memory']


@pytest.mark.parametrize('current, expected', [
    ('', f'{SCHEDULER}=false'),
    ('--xla_force_host_platform_device_count=8',
     f'--xla_force_host_platform_device_count=8 {SCHEDULER}=false'),
    (f'{SCHEDULER}=true', f'{SCHEDULER}=true'),  # the user's choice stays
    (f' {SCHEDULER}=false ', f'{SCHEDULER}=false'),
])
def test_defaults_are_added_unless_the_user_set_them(current, expected):
  assert xla_flags.with_defaults(current, MEMORY) == expected
  env = {'XLA_FLAGS': current} if current else {}
  xla_flags.apply(env, MEMORY)
  assert env['XLA_FLAGS'].split() == expected.split()
  xla_flags.apply(env, MEMORY)  # once is enough: a restarted process adds nothing twice
  assert env['XLA_FLAGS'].split() == expected.split()


def _config(model_name, image_size, batch_size, **kwargs):
  return ml_collections.ConfigDict(dict(model_name=model_name, image_size=image_size,
                                        batch_size=batch_size, **kwargs))


def test_each_schedule_adds_its_flags():
  assert set(xla_flags.SCHEDULES) == {'memory', 'concurrency'}
  assert xla_flags.CHOICES == ('auto', 'memory', 'concurrency')
  assert xla_flags.with_defaults('', xla_flags.SCHEDULES['memory']) == f'{SCHEDULER}=false'
  assert xla_flags.with_defaults('', xla_flags.SCHEDULES['concurrency']) == ''  # XLA's default
  config = _config('ViT-Ti/16', 224, 32, xla_cpu_schedule='concurrency')
  assert xla_flags.schedule_flags(config, {}) == ()  # a config's choice wins over the size
  config.xla_cpu_schedule = None  # a config's None is the key's default, 'auto'
  assert xla_flags.schedule_flags(config, {}) == xla_flags.SCHEDULES['memory']
  del config['xla_cpu_schedule']
  assert xla_flags.resolve(config, {}) == 'memory'


@pytest.mark.parametrize('model, image, batch, extra, values', [
    ('ViT-Ti/16', 224, 32, {}, 32 * (14 * 14 + 1) * 192),                     # 1.2 M: memory
    ('ViT-Ti/16', 224, 32, {'accum_steps': 2}, 16 * (14 * 14 + 1) * 192),     # a micro-batch
    ('ViT-Ti/16', 160, 32, {}, 32 * (10 * 10 + 1) * 192),
    ('ViT-Mu/7', 28, 64, {}, 64 * (4 * 4 + 1) * 64),                          # make train's
    ('R50+ViT-B/16', 224, 8, {}, 8 * 56 * 56 * 256),                          # the stem's map
    ('R+ViT-Mu/4', 28, 64, {}, 64 * (7 * 7 + 1) * 64),                        # stem only: 7x7x64
    ('BiT-R50x1', 224, 8, {}, 8 * 56 * 56 * 256),
    ('BiT-R14x0.5', 28, 64, {}, 64 * 7 * 7 * 128),
])
def test_auto_decides_by_the_largest_activation(model, image, batch, extra, values):
  config = _config(model, image, batch, **extra)
  assert xla_flags.largest_activation(config, {}) == values
  expected = 'memory' if values >= 2 ** 20 else 'concurrency'
  assert xla_flags.resolve(config, {}) == expected
  # Simulated CPU devices split the batch (the suite's 8 here).
  devices = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8 --xla_cpu_foo=1'}
  assert xla_flags.largest_activation(config, devices) == values // 8


@pytest.mark.parametrize('mesh, parallelism, ways', [
    (dict(data=-1, fsdp=1, model=1), 'jit', 8),
    (dict(data=1, fsdp=-1, model=1), 'jit', 8),   # FSDP splits the batch too
    (dict(data=4, fsdp=1, model=2), 'jit', 4),    # the model axis holds the same activations
    (dict(data=2, fsdp=1, model=-1), 'jit', 2),
    (dict(data=-1, fsdp=1, model=1), 'pmap', 8),
    (dict(data=3, fsdp=1, model=1), 'jit', 8),    # 3 does not divide 8: the program says so later
])
def test_auto_counts_the_devices_that_split_the_batch(mesh, parallelism, ways):
  config = _config('ViT-Ti/16', 224, 32, parallelism=parallelism, mesh=mesh)
  devices = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  assert xla_flags.largest_activation(config, devices) == 32 // ways * 197 * 192
  # ViT-B/16 at batch 64 on 8 devices: 8 images per device under data parallelism (1.2 M
  # values, the memory order); 16 with a model axis of 2 (2.4 M).
  config = _config('ViT-B/16', 224, 64, parallelism=parallelism, mesh=mesh)
  assert xla_flags.largest_activation(config, devices) == 64 // ways * 197 * 768


def test_auto_splits_the_global_batch_over_every_process():
  """--num_processes=N: the batch is global, so each process's devices get 1/N of it."""
  config = _config('ViT-Ti/16', 224, 32)
  devices = {'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  assert xla_flags.largest_activation(config, devices, processes=2) == 16 * 197 * 192
  assert xla_flags.resolve(config, devices) == 'memory'  # 32 images on the one device: 1.2 M
  assert xla_flags.resolve(config, devices, processes=2) == 'concurrency'  # 16 each: 605 k
  assert xla_flags.schedule_flags(config, devices, processes=2) == ()
  devices = {'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
  assert xla_flags.largest_activation(config, devices, processes=2) == 4 * 197 * 192


def test_auto_on_the_two_sides_of_the_threshold():
  assert xla_flags.AUTO_MEMORY_FROM == 2 ** 20
  assert xla_flags.resolve(_config('ViT-Ti/16', 224, 32), {}) == 'memory'
  assert xla_flags.resolve(_config('ViT-Ti/16', 224, 16), {}) == 'concurrency'  # 605 k
  assert xla_flags.resolve(_config('ViT-B/16', 224, 8), {}) == 'memory'
  assert xla_flags.resolve(_config('ViT-Mu/7', 28, 64), {}) == 'concurrency'
  bad = {'XLA_FLAGS': '--xla_force_host_platform_device_count=eight'}  # XLA refuses it later
  assert xla_flags.largest_activation(_config('ViT-Ti/16', 224, 32), bad) == 32 * 197 * 192


@pytest.mark.parametrize('value, expected', [
    ('', 'concurrency'), ('--xla_force_host_platform_device_count=8', 'concurrency'),
    (f'{SCHEDULER}=false', 'memory'), (f'--xla_foo=1 {SCHEDULER}=False', 'memory'),
    (f'{SCHEDULER}=true', 'concurrency'),
    (SCHEDULER, 'concurrency'),                                # a bare boolean flag is true
    (f'{SCHEDULER}=true {SCHEDULER}=false', 'memory'),         # the last setting counts
])
def test_the_schedule_in_effect_is_read_from_xla_flags(value, expected):
  assert xla_flags.in_effect({'XLA_FLAGS': value}) == expected


def test_the_apply_of_a_concurrency_schedule_adds_nothing():
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  xla_flags.apply(env, xla_flags.SCHEDULES['concurrency'])
  assert env == {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}


# Eight independent 512x512 products, summed: the concurrency-optimised order computes them all
# before the sum (eight 1 MiB temporaries alive at once), the memory-minimising one a few at a time.
# The train command's own entry point (its main and run: flags, restart, config checks) runs it in
# place of the training loop.
_TEMPS = """
import sys
import jax, jax.numpy as jnp
from vit_jax.commands import train
from vit_jax.train import loop

def f(x):
  return sum(jnp.sum(jnp.sin(x @ (x + i))) for i in range(8))

def train_and_evaluate(config, workdir, **kwargs):
  compiled = jax.jit(f).lower(jnp.ones((512, 512))).compile()
  print('TEMP', compiled.memory_analysis().temp_size_in_bytes)
  return {'accuracy': 0.0, 'count': 0}

loop.train_and_evaluate = train_and_evaluate
# One process stands for each of --num_processes: joining the others is not what is tested here.
from vit_jax import parallel
parallel.init_distributed = lambda *args, **kwargs: None
sys.argv = ['train', '--config=configs/mnist5k.py', '--workdir=unused', *sys.argv[1:]]
train.main()
"""


@pytest.mark.slow  # a subprocess each: XLA reads XLA_FLAGS once per process
def test_the_train_command_compiles_with_the_configs_schedule():
  def temp_bytes(xla, *args):
    env = dict(os.environ, XLA_FLAGS=xla)
    out = subprocess.run([sys.executable, '-c', _TEMPS, *args], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=120, check=True).stdout
    return int(out.split('TEMP ')[1].split()[0])

  large = ('--config.model_name=ViT-Ti/16', '--config.image_size=224', '--config.batch_size=32')
  concurrent = temp_bytes('')  # 'auto' on the config's small model: XLA's order, nothing added
  ours = temp_bytes('', *large)  # 'auto' on a 1.2 M-value activation: the command adds its flag
  theirs = temp_bytes(f'{SCHEDULER}=true', '--config.xla_cpu_schedule=memory')  # XLA_FLAGS win
  assert concurrent >= 8 * 512 * 512 * 4 and theirs >= 8 * 512 * 512 * 4  # all eight at once
  assert ours <= concurrent / 2, (ours, concurrent)
  assert theirs == concurrent
  # Two processes split the same global batch: 16 images per device, 605 k values, XLA's order.
  assert temp_bytes('', *large, '--num_processes=2') == concurrent

