"""Tests of vit_jax/data/ops.py: the preprocessing ops (each against what it must give), their
registry and op lists (parsed and checked without TensorFlow), the per-op seeds, and the
registry's table in docs/data.md."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax import registry
from vit_jax.data import ops, preprocess, specs
from vit_jax.errors import UserError


def _to_uint8(images):
  """Inverts value_range."""
  return np.round(images * 127.5 + 127.5).astype(np.uint8)


def _rgb(h=37, w=50, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


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
  small = ops.resize_small(tf.constant(image), 24).numpy()
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
# Op lists: parsed and checked against the registry.


def test_an_op_list_parses_into_checked_calls_with_their_slots():
  op_list = ops.parse("pad_crop(pad=2)|flip|randaug(1, magnitude=5)|channels(3)", 28, 'pp.train')
  assert str(op_list) == 'pad_crop(pad=2)|flip|randaug(1, magnitude=5)|channels(3)'
  assert op_list.slots == (0, 1, 2, 3) and op_list.random and op_list.channels() == 3
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


def test_eval_preprocessing_refuses_random_ops_in_either_spelling():
  with pytest.raises(UserError, match=r"^config.pp.eval: flip draws at random: eval "
                                      r'preprocessing is deterministic; use central_crop or '
                                      r'resize$'):
    specs.eval_spec({'ops': 'resize|flip', 'image_size': 8})
  with pytest.raises(UserError, match=r'^config.pp.eval_crop: inception_crop draws at random'):
    specs.eval_spec({'crop': 'inception', 'image_size': 8})


def test_the_older_keys_compose_the_lists_their_crop_names_and_slots_included():
  """pp.train_crop / pp.eval_crop name an op ('inception' and 'central' keep their older names);
  pad_crop takes pp.pad, resize_crop and central_crop pp.resize; randaug keeps slot 2 without a
  flip, the slot its draws have always come from."""
  spec = specs.train_spec(dict(crop='inception', image_size=16, flip=True, channels=3))
  assert (str(spec.ops), spec.ops.slots) == ('inception_crop|flip|channels(3)', (0, 1, 3))
  spec = specs.train_spec(dict(crop='resize_crop', image_size=16, resize=20, randaug_layers=2,
                               randaug_magnitude=9))
  assert str(spec.ops) == 'resize_crop(resize=20)|randaug(num_layers=2, magnitude=9)'
  assert spec.ops.slots == (0, 2)
  assert str(specs.eval_spec(dict(crop='central', image_size=16, resize=18)).ops) == (
      'central_crop(resize=18)')
  spec = specs.train_spec(dict(crop='resize', image_size=16, pad=3, resize=5, flip=False))
  assert str(spec.ops) == 'resize'  # pad and resize go to the crops that take them
  with pytest.raises(UserError, match=r"^config.pp.train_crop: pad_crop\(pad=None\): pad "):
    specs.train_spec(dict(crop='pad_crop', image_size=16))
  with pytest.raises(UserError, match=r"^unknown preprocessing op 'random' in "
                                      r'config.pp.train_crop: use one of central_crop'):
    specs.train_spec(dict(crop='random', image_size=16))


def test_pp_accepts_config_dict_and_refuses_unknown_keys():
  import ml_collections  # pylint: disable=g-import-not-at-top
  pp = ml_collections.ConfigDict({'crop': 'pad_crop', 'image_size': 32, 'resize': 36, 'pad': 4,
                                  'flip': True, 'channels': 3})
  assert str(specs.train_spec(pp).ops) == 'pad_crop(pad=4)|flip|channels(3)'
  pp.crop = 'central'
  assert str(specs.eval_spec(pp).ops) == 'central_crop(resize=36)|channels(3)'
  with pytest.raises(UserError, match=r"unknown train preprocessing key\(s\) \['crpo'\]"):
    specs.train_spec({'crpo': 'resize', 'image_size': 28})
  with pytest.raises(UserError, match="'image_size'"):
    specs.train_spec({'ops': 'resize'})


# --------------------------------------------------------------------------------------------
# Seeds, shapes and a registered op of a test's own.


def test_op_seeds_are_the_slots_of_the_example_seed():
  """Slots 0 and 1 are the halves of stateless_split, later ones stateless_fold_in: the crop,
  flip and RandAugment seeds earlier versions drew from (so their streams resume exactly)."""
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
  spec = specs.train_spec({'ops': 'pad_crop(pad=3)|pad_crop(pad=3)', 'image_size': 20})
  places, one = set(), specs.train_spec({'ops': 'pad_crop(pad=3)', 'image_size': 20})
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
  spec = specs.train_spec({'ops': 'flip', 'image_size': 16})
  with pytest.raises(UserError, match=r'^preprocessing flip gives images of shape \(20, 30, 3\), '
                                      r'not \[16, 16, 3\]: end with an op that gives'):
    preprocess.train_preprocess(image, tf.constant([0, 0], tf.int64), spec)

  @ops.register('gray_test')
  def gray_test(image, ctx):  # pylint: disable=unused-variable
    """Gray without channels(1)."""
    del ctx
    return tf.image.rgb_to_grayscale(image)

  try:
    spec = specs.eval_spec({'ops': 'resize|gray_test', 'image_size': 16})
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
                               pp={'ops': 'brighten_test(most=60)', 'image_size': 28})

  try:
    with pytest.raises(UserError, match=r'^config.pp.train: brighten_test\(most=-1\): most=-1 '
                                        r'must be an int >= 0$'):
      specs.train_spec({'ops': 'brighten_test(most=-1)', 'image_size': 28})
    plain = data.train_iterator(dataset='mnist5k', split='train', data_dir=str(tmp_path),
                                batch_size=32, seed=3, pp={'ops': 'resize', 'image_size': 28})
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
  from vit_jax.data import config_pp  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config()
  assert config_pp.input_channels(config, 1) == 1
  config.pp.channels = 3  # both composed lists end with channels(3)
  assert config_pp.input_channels(config, 1) == 3
  config.pp.channels = None
  config.pp.train = 'pad_crop(pad=2)|channels(3)'
  with pytest.raises(UserError, match=r'^the train preprocessing gives 3-channel images and the '
                                      r'eval preprocessing 1-channel ones: end both with'):
    config_pp.input_channels(config, 1)
  config.pp.eval = 'resize|channels(3)'
  assert config_pp.input_channels(config, 1) == 3
  assert config_pp.input_channels(config, 3) == 3  # RGB stored: channels(3) keeps them
