"""Tests of vit_jax/data/ops.py: the preprocessing ops (each against what it must give), their
registry and op lists (parsed and checked without TensorFlow), the per-op seeds, and the
registry's table in docs/data.md."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax import registry
from vit_jax.data import ops, preprocess, specs
from vit_jax.errors import UserError


def _value_range(image):
  """[0, 255] -> [-1, 1] as the pipeline scales the last op's output."""
  return (tf.cast(image, tf.float32) - 127.5) / 127.5


def _to_uint8(images):
  """Inverts value_range."""
  return np.round(images * 127.5 + 127.5).astype(np.uint8)


def _rgb(h=37, w=50, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _train_op(image, ops_text, seed=0, position=0, stream=0, size=16):
  spec = specs.train_spec(ops_text, size)
  return preprocess.train_preprocess(
      tf.constant(image), preprocess.example_seed(seed, stream, position), spec).numpy()


def test_the_last_ops_output_is_scaled_from_0_255_to_minus1_1():
  image = tf.constant([[[0], [51]], [[255], [255]]], tf.uint8)
  out = preprocess.eval_preprocess(image, specs.eval_spec('resize', 2)).numpy()
  assert out.dtype == np.float32
  np.testing.assert_array_equal(out.ravel(), np.float32([-1.0, -0.6, 1.0, 1.0]))


TRAIN_SPECS = {  # output side 16
    'inception': 'inception_crop',
    'resize_crop': 'resize_crop(resize=24)',
    'pad_crop': 'pad_crop(pad=3)',
    'resize': 'resize|flip',
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
  spec = specs.train_spec(TRAIN_SPECS[mode].replace('|flip', '') + '|flip', 16)
  image = tf.constant(_rgb())

  def fn(position):
    return preprocess.train_preprocess(image, preprocess.example_seed(5, 1, position), spec)
  eager = np.stack([fn(tf.constant(p, tf.int64)).numpy() for p in range(6)])
  in_data = np.stack(list(tf.data.Dataset.range(6).map(fn).as_numpy_iterator()))
  np.testing.assert_array_equal(eager, in_data)


def test_eval_ops_same_eagerly_and_in_tf_data():
  for text, channels in (('central_crop(resize=20)', 3), ('resize|channels(1)', 1)):
    spec = specs.eval_spec(text, 16)
    fn = lambda im, spec=spec: preprocess.eval_preprocess(im, spec)
    images = [_rgb(seed=s) for s in range(3)]
    eager = np.stack([fn(tf.constant(im)).numpy() for im in images])
    in_data = np.stack(list(
        tf.data.Dataset.from_tensor_slices(np.stack(images)).map(fn).as_numpy_iterator()))
    np.testing.assert_array_equal(eager, in_data)
    assert eager.shape == (3, 16, 16, channels)


def _windows(big, size):
  return {big[y:y + size, x:x + size].tobytes(): (y, x)
          for y in range(big.shape[0] - size + 1) for x in range(big.shape[1] - size + 1)}


def test_pad_crop_is_a_shifted_window_of_the_padded_image():
  image = _rgb(28, 28)
  padded = np.pad(image, [(3, 3), (3, 3), (0, 0)])
  windows = _windows(_to_uint8_exact(_value_range(padded).numpy()), 28)
  offsets = set()
  for p in range(30):
    out = _train_op(image, 'pad_crop(pad=3)', position=p, size=28)
    offsets.add(windows[_to_uint8_exact(out).tobytes()])  # KeyError if not a window
  assert len(offsets) > 5


def _to_uint8_exact(x):
  u = _to_uint8(x)
  np.testing.assert_allclose(u.astype(np.float32), x * 127.5 + 127.5, atol=1e-3)
  return u


def test_resize_crop_is_a_window_of_the_resized_image():
  image = _rgb(30, 45)
  small = ops.resize_small(tf.constant(image), 24).numpy()
  assert small.shape == (24, 36, 3)
  windows = {}
  for y in range(24 - 16 + 1):
    for x in range(36 - 16 + 1):
      windows[(y, x)] = _value_range(small[y:y + 16, x:x + 16]).numpy()
  offsets = set()
  for p in range(20):
    out = _train_op(image, TRAIN_SPECS['resize_crop'], position=p)
    match = [k for k, w in windows.items() if np.array_equal(w, out)]
    assert match, 'resize_crop output is not a window of the resized image'
    offsets.add(match[0])
  assert len(offsets) > 5


def test_inception_crop_of_constant_image_is_constant_and_varies_in_area():
  constant = np.full((40, 40, 3), 200, np.uint8)
  out = _train_op(constant, 'inception_crop', position=1)
  np.testing.assert_allclose(out, (200 - 127.5) / 127.5, atol=1e-6)
  # A horizontal ramp: the spread of values in the crop grows with the crop width.
  ramp = np.tile(np.arange(0, 240, 6, dtype=np.uint8)[None, :, None], (40, 1, 3))
  spans = [np.ptp(_train_op(ramp, 'inception_crop', position=p))
           for p in range(20)]
  assert max(spans) - min(spans) > 0.5


def test_flip_mirrors_with_probability_half():
  image = _rgb(28, 28)
  plain = _value_range(image).numpy()
  flipped = 0
  for p in range(32):
    out = _train_op(image, 'resize|flip', position=p, size=28)
    if np.array_equal(out, plain[:, ::-1]):
      flipped += 1
    else:
      np.testing.assert_array_equal(out, plain)
  assert 6 <= flipped <= 26


def test_eval_central_and_resize():
  image = _rgb(40, 60)
  spec = specs.eval_spec('central_crop(resize=40)', 20)
  out = preprocess.eval_preprocess(tf.constant(image), spec).numpy()
  np.testing.assert_allclose(out, _value_range(image[10:30, 20:40]).numpy(), atol=1e-5)
  small = _rgb(14, 14)
  big = np.repeat(np.repeat(small, 2, axis=0), 2, axis=1)  # 28x28 made of 2x2 blocks
  spec = specs.eval_spec('resize', 14)
  out = preprocess.eval_preprocess(tf.constant(big), spec).numpy()
  np.testing.assert_allclose(out, _value_range(small).numpy(), atol=1e-6)


def test_channels_gray_stays_gray_unless_three_requested():
  gray = _rgb(28, 28)[:, :, :1]
  one = _train_op(gray, 'resize', size=28)
  three = _train_op(gray, 'resize|channels(3)', size=28)
  assert one.shape == (28, 28, 1) and three.shape == (28, 28, 3)
  for c in range(3):
    np.testing.assert_array_equal(three[:, :, c], one[:, :, 0])




# --------------------------------------------------------------------------------------------
# Op lists: parsed and checked against the registry.


def test_an_op_list_parses_into_checked_calls_with_their_slots():
  op_list = ops.parse("pad_crop(pad=2)|flip|randaug(1, magnitude=5)|channels(3)", 28, 'pp.train')
  assert str(op_list) == 'pad_crop(pad=2)|flip|randaug(1, magnitude=5)|channels(3)'
  assert op_list.random and op_list.channels() == 3
  assert [c.name for c in op_list.calls] == ['pad_crop', 'flip', 'randaug', 'channels']
  assert op_list.calls[2] == registry.Call('randaug', (1,), (('magnitude', 5),))


@pytest.mark.parametrize('text, message', [
    ('pad_crop|flp', "^unknown preprocessing op 'flp' in config.pp.train: use one of "
                     "central_crop, channels, flip, inception_crop, pad_crop, randaug, resize, "
                     r"resize_crop \(or register one: docs/data.md\)$"),
    ('pad_crop(pd=2)', r"^config.pp.train: pad_crop\(pd=2\) does not fit preprocessing op "
                       r"pad_crop\(pad=0\): got an unexpected keyword argument 'pd'$"),
    ('pad_crop(pad=-1)', r'^config.pp.train: pad_crop\(pad=-1\): pad \(pixels of zero padding '
                         r'per side\) must be an int >= 0, got -1$'),
    ('resize_crop(resize=20)', r'^config.pp.train: resize_crop\(resize=20\): resize \(the '
                               r'shorter side, >= the output side 28\) must be an int >= 28, '
                               r'got 20$'),
    ('channels(2)', r'^config.pp.train: channels\(2\): n=2 must be 1 or 3$'),
    ('flip(0.5)', r'^config.pp.train: flip\(0.5\) does not fit preprocessing op flip\(\): too '
                  r'many positional arguments$'),
    ('pad_crop(pad=two)', r"^config.pp.train='pad_crop\(pad=two\)': the arguments of pad_crop "
                          r'must be literals'),
    ('pad_crop(', r"^config.pp.train='pad_crop\(' is not a list of calls"),
    ('pad_crop+flip', r"^config.pp.train='pad_crop\+flip': 'pad_crop \+ flip' is not a call"),
    ('', r'^config.pp.train is empty'),
])
def test_a_bad_op_list_is_one_line_naming_the_key(text, message):
  with pytest.raises(UserError, match=message):
    ops.parse(text, 28, 'pp.train')


def test_eval_preprocessing_refuses_random_ops():
  with pytest.raises(UserError, match=r"^config.pp.eval: flip draws at random: eval "
                                      r'preprocessing is deterministic; use central_crop or '
                                      r'resize$'):
    specs.eval_spec('resize|flip', 8)
  with pytest.raises(UserError, match=r'^config.pp.eval: inception_crop draws at random'):
    specs.eval_spec('inception_crop', 8)


def test_a_spec_needs_an_output_side():
  with pytest.raises(UserError, match=r'^config.pp.train: the output side \(config.image_size\) '
                                      r'must be an int >= 1, got None$'):
    specs.train_spec('resize', None)


def test_at_size_scales_the_resize_before_a_crop_with_the_output():
  op_list = specs.eval_spec('central_crop(resize=256)|channels(3)', 224).ops
  assert str(op_list.at_size(448)) == 'central_crop(resize=512)|channels(3)'
  assert op_list.at_size(448).size == 448


# --------------------------------------------------------------------------------------------
# Seeds, shapes and a registered op of a test's own.


def test_op_seeds_are_the_slots_of_the_example_seed():
  """Slots 0 and 1 are the halves of stateless_split, later ones stateless_fold_in."""
  seed = tf.constant([7, 11], tf.int64)
  halves = tf.random.experimental.stateless_split(seed, num=2).numpy()
  np.testing.assert_array_equal(ops.op_seed(seed, 0), halves[0])
  np.testing.assert_array_equal(ops.op_seed(seed, 1), halves[1])
  np.testing.assert_array_equal(ops.op_seed(seed, 2),
                                tf.random.experimental.stateless_fold_in(seed, 2))
  assert len({ops.op_seed(seed, s).numpy().tobytes() for s in range(5)}) == 5


def test_the_same_random_op_at_two_slots_draws_twice():
  """pad_crop twice: two independent shifts (slots 0 and 1), each a pure function of the example
  seed and its slot."""
  image = np.zeros((20, 20, 1), np.uint8)
  image[10, 10] = 255  # a dot: its place says the total shift
  spec = specs.train_spec('pad_crop(pad=3)|pad_crop(pad=3)', 20)
  places, one = set(), specs.train_spec('pad_crop(pad=3)', 20)
  for p in range(40):
    seed = preprocess.example_seed(1, 0, p)
    out = _to_uint8(preprocess.train_preprocess(tf.constant(image), seed, spec).numpy())
    first = _to_uint8(preprocess.train_preprocess(tf.constant(image), seed, one).numpy())
    again = _to_uint8(preprocess.train_preprocess(tf.constant(image), seed, spec).numpy())
    np.testing.assert_array_equal(out, again)
    if out.max() and first.max():  # the dot stayed inside both windows
      places.add((tuple(np.argwhere(first)[0]), tuple(np.argwhere(out)[0])))
  assert len({b for _, b in places}) > len({a for a, _ in places}) / 2
  assert any(a != b for a, b in places)  # the second crop moved it again


def test_a_list_that_gives_another_size_or_channel_count_is_one_line():
  image = tf.constant(_rgb(20, 30))
  spec = specs.train_spec('flip', 16)
  with pytest.raises(UserError, match=r'^preprocessing flip gives images of shape \(20, 30, 3\), '
                                      r'not \[16, 16, 3\]: end with an op that gives'):
    preprocess.train_preprocess(image, tf.constant([0, 0], tf.int64), spec)

  @ops.register('gray_test')
  def gray_test(image, ctx):  # pylint: disable=unused-variable
    """Gray without channels(1)."""
    del ctx
    return tf.image.rgb_to_grayscale(image)

  try:
    spec = specs.eval_spec('resize|gray_test', 16)
    with pytest.raises(UserError, match=r'gives images of shape \(16, 16, 1\), not \[16, 16, 3\]'):
      preprocess.eval_preprocess(image, spec)
  finally:
    ops.OPS.unregister('gray_test')


def test_a_registered_op_runs_seeded_in_the_streams_and_resumes_exactly(tmp_path):
  """An op of the test's own, random: registered, named in the op list of a train stream, it
  draws from its slot's seed: the same at a resumed step, other with another run seed."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top

  def check(size, most):
    del size
    if not isinstance(most, int) or most < 0:
      raise UserError(f'most={most!r} must be an int >= 0')

  @ops.register('brighten_test', random=True, check=check)
  def brighten_test(image, ctx, most=40):  # pylint: disable=unused-variable
    """Adds one random shift in [0, most] to every pixel."""
    shift = tf.random.stateless_uniform([], ctx.seed, 0, most + 1, dtype=tf.int32)
    return tf.minimum(tf.cast(image, tf.int32) + shift, 255)

  def stream(start_step=0, seed=3):
    return data.train_iterator(dataset='mnist5k', split='train', data_dir=str(tmp_path),
                               batch_size=32, seed=seed, start_step=start_step,
                               spec=specs.train_spec('brighten_test(most=60)', 28))

  try:
    with pytest.raises(UserError, match=r'^config.pp.train: brighten_test\(most=-1\): most=-1 '
                                        r'must be an int >= 0$'):
      specs.train_spec('brighten_test(most=-1)', 28)
    plain = data.train_iterator(dataset='mnist5k', split='train', data_dir=str(tmp_path),
                                batch_size=32, seed=3, spec=specs.train_spec('resize', 28))
    it = stream()
    batches = [next(it) for _ in range(3)]
    records = [next(plain) for _ in range(3)]  # the same examples (same seed), unshifted
    shifts = []
    for got, record in zip(batches, records):
      np.testing.assert_array_equal(got['label'], record['label'])
      for image, raw in zip(_to_uint8(got['image']).astype(int), _to_uint8(record['image'])):
        background = raw == 0  # mnist's background: 0 + the shift (no clipping there)
        shift = np.unique(image[background])
        assert len(shift) == 1 and 0 <= shift[0] <= 60
        shifts.append(int(shift[0]))
    assert len(set(shifts)) > 10
    np.testing.assert_array_equal(next(stream(start_step=2))['image'], batches[2]['image'])
    assert not np.array_equal(next(stream(seed=4))['image'], batches[0]['image'])
  finally:
    ops.OPS.unregister('brighten_test')


def test_the_model_input_channels_are_the_train_ops_and_the_eval_ops_must_agree():
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config()
  assert specs.of_config(config).input_channels(1) == 1
  config.pp.train = 'pad_crop(pad=2)|channels(3)'
  with pytest.raises(UserError, match=r'^the train preprocessing gives 3-channel images and the '
                                      r'eval preprocessing 1-channel ones: end both'):
    specs.of_config(config).input_channels(1)
  config.pp.eval = 'resize|channels(3)'
  assert specs.of_config(config).input_channels(1) == 3
  assert specs.of_config(config).input_channels(3) == 3  # RGB stored: channels(3) keeps them
