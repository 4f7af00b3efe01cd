"""The persistent compilation cache of command-line runs (vit_jax/platform/compile_cache.py)."""

import os
import subprocess
import sys

import pytest

from vit_jax.platform import compile_cache
from vit_jax.platform import cpus
from helpers import ROOT


def test_cache_dir_policy(tmp_path, monkeypatch):
  monkeypatch.setattr(cpus, 'fingerprint', lambda: 'x86_64-abcd1234')
  home = str(tmp_path)
  monkeypatch.setenv('HOME', home)
  assert compile_cache.cache_dir({}) == f'{home}/.cache/vit_jax/xla/x86_64-abcd1234'
  assert (compile_cache.cache_dir({'XDG_CACHE_HOME': '/c'}) ==
          '/c/vit_jax/xla/x86_64-abcd1234')
  for off in ('off', '0', 'FALSE', 'no', ''):
    assert compile_cache.cache_dir({'VIT_JAX_COMPILATION_CACHE': off}) is None, off
  assert compile_cache.cache_dir({'VIT_JAX_COMPILATION_CACHE': 'gs://b/xla'}) == 'gs://b/xla'
  # JAX's own variable wins: JAX reads it, nothing is set on top.
  assert compile_cache.cache_dir({'JAX_COMPILATION_CACHE_DIR': '/j',
                                  'VIT_JAX_COMPILATION_CACHE': '/v'}) is None


def test_enable_sets_the_cache_directory(tmp_path, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  before = jax.config.jax_compilation_cache_dir
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  monkeypatch.setenv('VIT_JAX_COMPILATION_CACHE', str(tmp_path / 'xla'))
  try:
    assert compile_cache.enable() == str(tmp_path / 'xla')
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / 'xla')
  finally:
    jax.config.update('jax_compilation_cache_dir', before)


def test_host_key_separates_processors(tmp_path):
  def key(text):
    path = tmp_path / 'cpuinfo'
    path.write_text(text)
    return cpus.fingerprint(str(path))

  zen = 'model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n'
  xeon = 'model name\t: Intel(R) Xeon(R)\nflags\t\t: fpu avx2 avx512f avx512_fp16\n'
  assert key(zen) == key(zen * 2)  # one line per core: the same processor
  assert key(zen) != key(xeon)
  # Arm: no model name; the cores' parts and features, all of them (big and little cores).
  big = 'processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n\n'
  little = 'processor\t: 1\nFeatures\t: fp asimd sve\nCPU part\t: 0xd46\n\n'
  assert key(big + little) == key(big + little + little) != key(big + big)
  assert key(big) != key(zen)


def _compile_only(tmp_path, run, *flags, **env):
  environ = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  environ.update(HOME=str(tmp_path), VIT_JAX_HUGEPAGES='0',
                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                 JAX_DEBUG_LOG_MODULES='jax._src.compiler', **env)
  environ.pop('XDG_CACHE_HOME', None)
  command = [sys.executable, '-m', 'vit_jax.main', '--config=configs/mnist5k.py:steps=1000',
             '--config.model_name=ViT-Ze/4', '--config.compile_only=True',
             '--config.dataset=imagenet2012', f'--config.data_dir={tmp_path}/no_data',
             '--config.num_classes=10',
             f'--workdir={tmp_path}/{run}', '--verbosity=0', *flags]
  result = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stderr


@pytest.mark.slow
def test_command_line_runs_reuse_compiled_programs(tmp_path):
  first = _compile_only(tmp_path, 'a')
  root = tmp_path / '.cache' / 'vit_jax' / 'xla'
  (host,) = os.listdir(root)
  entries = sorted(os.listdir(root / host))
  assert any(e.startswith('jit_wrapped-') and e.endswith('-cache') for e in entries), entries
  assert 'Persistent compilation cache hit' not in first
  # Another point of a sweep: the learning rate, the schedule and the weight decay are the train
  # step's arguments, so both steps (train and eval) come from the cache and nothing is added.
  second = _compile_only(tmp_path, 'b', '--config.lr=0.05', '--config.total_steps=700',
                         '--config.warmup_steps=30', '--config.weight_decay=0.3')
  assert second.count("Persistent compilation cache hit for 'jit_wrapped'") == 2, second[-3000:]
  assert sorted(os.listdir(root / host)) == entries


def test_the_cache_can_be_turned_off(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  before = jax.config.jax_compilation_cache_dir
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  monkeypatch.setenv('VIT_JAX_COMPILATION_CACHE', 'off')
  assert compile_cache.enable() is None
  assert jax.config.jax_compilation_cache_dir == before
