"""The XLA flags the training commands set for themselves (vit_jax/xla_flags.py)."""

import os
import subprocess
import sys

import ml_collections
import pytest

from vit_jax import xla_flags

from helpers import ROOT

SCHEDULER = '--xla_cpu_enable_concurrency_optimized_scheduler'


@pytest.mark.parametrize('current, expected', [
    ('', f'{SCHEDULER}=false'),
    ('--xla_force_host_platform_device_count=8',
     f'--xla_force_host_platform_device_count=8 {SCHEDULER}=false'),
    (f'{SCHEDULER}=true', f'{SCHEDULER}=true'),  # the user's choice stays
    (f' {SCHEDULER}=false ', f'{SCHEDULER}=false'),
])
def test_defaults_are_added_unless_the_user_set_them(current, expected):
  assert xla_flags.with_defaults(current) == expected
  env = {'XLA_FLAGS': current} if current else {}
  xla_flags.apply(env)
  assert env['XLA_FLAGS'].split() == expected.split()
  xla_flags.apply(env)  # once is enough: a restarted process adds nothing twice
  assert env['XLA_FLAGS'].split() == expected.split()


def test_each_schedule_adds_its_flags():
  assert set(xla_flags.SCHEDULES) == {'memory', 'concurrency'}
  assert xla_flags.with_defaults('', xla_flags.SCHEDULES['memory']) == f'{SCHEDULER}=false'
  assert xla_flags.with_defaults('', xla_flags.SCHEDULES['concurrency']) == ''  # XLA's default
  config = ml_collections.ConfigDict({'xla_cpu_schedule': 'concurrency'})
  assert xla_flags.schedule_flags(config) == ()
  config.xla_cpu_schedule = None  # a config's None is the key's default
  assert xla_flags.schedule_flags(config) == xla_flags.TRAINING
  assert xla_flags.schedule_flags(ml_collections.ConfigDict()) == xla_flags.TRAINING
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

  ours = temp_bytes('')  # the config's default, 'memory': the command adds its flag
  concurrent = temp_bytes('', '--config.xla_cpu_schedule=concurrency')
  theirs = temp_bytes(f'{SCHEDULER}=true')  # the user's XLA_FLAGS win over the config
  assert concurrent >= 8 * 512 * 512 * 4 and theirs >= 8 * 512 * 512 * 4  # all eight at once
  assert ours <= concurrent / 2, (ours, concurrent)
  assert theirs == concurrent

