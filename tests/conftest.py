"""Test setup: 8 simulated CPU devices, quiet TensorFlow, and shared small fixtures."""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A tfds data_dir shared by the session, with mnist5k prepared in it (so no test's output
  depends on whether it was the first to touch the dataset)."""
  from vit_jax.data import mnist5k  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tfds'))
  mnist5k.prepare(path)
  return path
