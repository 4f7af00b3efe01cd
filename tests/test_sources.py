"""Data sources by name from a user's side: a config file registers a source of its own (a
prefix and a `load` function), the name resolves to it, its records stream and a run trains on it
end to end; a prefix registered twice is refused."""

import importlib.util
import json
import os

import numpy as np
import pytest

from vit_jax import data
from vit_jax.data import catalog, sources
from vit_jax.train import loop, validate

CONFIG = '''
"""mnist5k with its labels replaced by their parity, served by a source of this file's own."""

from vit_jax.configs import mnist5k
from vit_jax.data import catalog, sources

SIZES = catalog.EMBEDDED['mnist5k'].SPLIT_SIZES


class Parity:
  """'parity:mnist5k': the digits' images, labelled 0 (even) or 1 (odd)."""

  def __init__(self, name):
    self.name, self.num_classes, self.image_shape = name, 2, (28, 28, 1)
    self.split_sizes, self.data_dir, self.class_names = dict(SIZES), '', ('even', 'odd')

  def num_examples(self, split):
    return catalog.num_examples(split, SIZES)

  def records(self, split, cache):
    import tensorflow as tf
    images, labels = catalog.in_read_order('mnist5k', split)
    return tf.data.Dataset.from_tensor_slices((images, labels % 2))


sources.register('parity:', lambda dataset, data_dir: Parity(dataset))


def get_config(arg=None):
  c = mnist5k.get_config(arg)
  c.dataset = 'parity:mnist5k'
  return c
'''


@pytest.fixture
def parity_config(tmp_path):
  path = tmp_path / 'parity.py'
  path.write_text(CONFIG)
  spec = importlib.util.spec_from_file_location('parity_under_test', str(path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    yield module
  finally:
    sources.unregister('parity:')


def test_a_config_registers_a_source_and_a_run_trains_on_it(parity_config, tmp_path):
  info = data.get_info('parity:mnist5k', None)
  assert (info.num_classes, info.class_names, info.num_examples('train[:10%]')) == (
      2, ('even', 'odd'), 400)
  images, labels = catalog.in_read_order('mnist5k', 'test[:20]')
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  streamed = list(pipeline.source_records(info, 'test[:20]', cache=False).as_numpy_iterator())
  assert [int(label) for _, label in streamed] == (labels % 2).tolist()
  assert np.array_equal(np.stack([image for image, _ in streamed]), images)

  config = parity_config.get_config('model_name=ViT-Ze/4,steps=4,batch_size=16')
  config.warmup_steps, config.eval_every, config.progress = 1, 4, False
  config.eval_split = 'test[:64]'
  validate.check_config(config)
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  assert max(r['step'] for r in rows if r['split'] == 'train') == 4
  evals = [r for r in rows if r['split'] not in ('train',) and 'accuracy' in r]
  assert evals and all(0.0 <= r['accuracy'] <= 1.0 for r in evals), rows


def test_a_prefix_is_registered_once():
  sources.register('twice_test:', lambda dataset, data_dir: None)
  try:
    with pytest.raises(ValueError, match="prefix 'twice_test:' is registered already"):
      sources.register('twice_test:', lambda dataset, data_dir: None)
  finally:
    sources.unregister('twice_test:')
  assert sources.find('twice_test:x') is None
