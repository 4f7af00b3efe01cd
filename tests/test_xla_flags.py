"""The XLA flags the training commands set for themselves (vit_jax/xla_flags.py)."""

import os
import subprocess
import sys

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


# Eight independent 512x512 products, summed: the concurrency-optimised order computes them all
# before the sum (eight 1 MiB temporaries alive at once), the memory-minimising one a few at a time.
# The train command's own entry point (its main: flags, restart, run_main) runs it in place of
# training.
_TEMPS = '''
import sys
import jax, jax.numpy as jnp
from vit_jax.commands import train

def f(x):
  return sum(jnp.sum(jnp.sin(x @ (x + i))) for i in range(8))

def run(argv):
  compiled = jax.jit(f).lower(jnp.ones((512, 512))).compile()
  print(compiled.memory_analysis().temp_size_in_bytes)
  return 0

train.run = run
sys.argv = ['train', '--config=configs/default.py', '--workdir=unused']
train.main()
'''


@pytest.mark.slow  # a subprocess each: XLA reads XLA_FLAGS once per process
def test_the_train_command_compiles_with_the_memory_minimising_schedule():
  def temp_bytes(xla):
    env = dict(os.environ, XLA_FLAGS=xla)
    out = subprocess.run([sys.executable, '-c', _TEMPS], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=120, check=True).stdout
    return int(out.split()[-1])

  ours = temp_bytes('')  # the command adds its flag
  theirs = temp_bytes(f'{SCHEDULER}=true')  # XLA's default scheduler, the user's choice kept
  assert theirs >= 8 * 512 * 512 * 4  # all eight products alive at once
  assert ours <= theirs / 2, (ours, theirs)
