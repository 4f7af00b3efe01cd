"""Test setup: 8 simulated CPU devices, quiet TensorFlow, and shared small fixtures."""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One persistent XLA compilation cache for the session's processes and the subprocesses they
# start: the suite compiles the same small programs many times (each `vit_jax.main` launch of the
# kill loop, each strategy run). A cache hit is the same executable, so results are unchanged.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.pytest_cache', 'xla'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A tfds data_dir shared by the session, with mnist5k prepared in it (so no test's output
  depends on whether it was the first to touch the dataset)."""
  from vit_jax.data import mnist5k  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tfds'))
  mnist5k.prepare(path)
  return path
