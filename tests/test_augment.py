"""AugReg pieces: mixup, RandAugment (each op against PIL or a known answer), Polyak averaging."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from vit_jax.configs import pretrain
from vit_jax.data import preprocess, randaug, specs
from vit_jax.errors import UserError
from vit_jax.tasks import losses, mixup
from vit_jax.train import polyak


# ---------------------------------------------------------------- mixup


def test_mixup_lambda_distribution():
  lams = np.asarray(jax.vmap(lambda k: mixup.sample_lambda(k, 1.0))(
      jax.random.split(jax.random.PRNGKey(0), 20000)))
  assert lams.min() >= 0.5 and lams.max() <= 1.0
  # Beta(1, 1) is uniform, so max(l, 1 - l) is uniform on [0.5, 1]: mean 0.75, variance 1/48.
  np.testing.assert_allclose(lams.mean(), 0.75, atol=0.005)
  np.testing.assert_allclose(lams.var(), 1 / 48, rtol=0.05)


def test_mixup_mixes_with_the_next_example():
  images = jnp.arange(4 * 2, dtype=jnp.float32).reshape(4, 2)
  targets = losses.one_hot(jnp.array([0, 1, 2, 0]), 3)
  mixed_x, mixed_t = mixup.mix(jnp.float32(0.7), images, targets)
  ref_x = 0.7 * np.asarray(images) + 0.3 * np.roll(np.asarray(images), 1, axis=0)
  np.testing.assert_allclose(mixed_x, ref_x, rtol=1e-6)
  np.testing.assert_allclose(mixed_t[1], [0.3, 0.7, 0.0], rtol=1e-6)  # 0.7 own + 0.3 of row 0
  np.testing.assert_allclose(mixed_t.sum(-1), 1.0, rtol=1e-6)


def test_mixup_objective_equals_manual_mixing():
  def apply_fn(variables, x, train, rngs):
    del train, rngs
    return x @ variables['params']['w']

  params = {'w': jnp.asarray(np.random.default_rng(0).normal(size=(2, 3)), jnp.float32)}
  images = jnp.asarray(np.random.default_rng(1).normal(size=(4, 2)), jnp.float32)
  labels = jnp.array([0, 1, 2, 1])
  objective = jax.jit(mixup.classification_objective(
      apply_fn=apply_fn, loss_fn=losses.softmax_xent, num_classes=3, label_smoothing=0.0,
      alpha=0.4))
  rng = jax.random.PRNGKey(5)
  loss, _ = objective({'params': params}, images, labels, rng)
  lam = mixup.sample_lambda(jax.random.split(rng)[0], 0.4)
  x, t = mixup.mix(lam, images, losses.one_hot(labels, 3))
  np.testing.assert_allclose(loss, losses.softmax_xent(x @ params['w'], t).mean(), rtol=1e-6)
  with pytest.raises(UserError, match='mixup'):
    mixup.classification_objective(apply_fn=apply_fn, loss_fn=losses.softmax_xent,
                                   num_classes=3, label_smoothing=0.0, alpha=-1.0)


# ---------------------------------------------------------------- Polyak averaging


def test_polyak_average_follows_the_params():
  params = {'w': jnp.zeros(3)}
  tx = optax.chain(optax.sgd(1.0), polyak.ema_of_params(0.5))
  state = tx.init(params)
  grads = {'w': -jnp.ones(3)}  # each step adds 1 to the params
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(params['w'], 3.0)  # the params themselves are not averaged
  # avg_t = 0.5 avg_{t-1} + 0.5 t: 0.5, 1.25, 2.125
  np.testing.assert_allclose(polyak.find_average(state)['w'], 2.125)

  class State:  # what the trainer passes: params plus the optimizer state
    pass
  train_state = State()
  train_state.params, train_state.opt_state = params, state
  np.testing.assert_allclose(polyak.eval_params(train_state)['w'], 2.125)
  train_state.opt_state = optax.sgd(1.0).init(params)
  assert polyak.eval_params(train_state) is params
  with pytest.raises(UserError, match='polyak_decay'):
    polyak.ema_of_params(1.0)


# ---------------------------------------------------------------- RandAugment ops


def _image(h=16, w=20, channels=3, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(30, 220, size=(h, w, channels)).astype(np.uint8)


def _pil(x):
  return Image.fromarray(x if x.shape[-1] == 3 else x[..., 0])


def _close(got, want, atol=1):
  got, want = np.asarray(got, np.int32), np.asarray(want, np.int32).reshape(np.shape(got))
  assert np.abs(got - want).max() <= atol, np.abs(got - want).max()


def test_pixel_ops_match_pil():
  x = _image()
  t = tf.constant(x)
  _close(randaug.invert(t), ImageOps.invert(_pil(x)), 0)
  _close(randaug.posterize(t, 3), ImageOps.posterize(_pil(x), 3), 0)
  _close(randaug.solarize(t, 128), ImageOps.solarize(_pil(x), 128), 0)
  _close(randaug.autocontrast(t), ImageOps.autocontrast(_pil(x)), 1)
  _close(randaug.equalize(t), ImageOps.equalize(_pil(x)), 0)
  for factor in (0.1, 0.5, 1.9):
    _close(randaug.color(t, factor), ImageEnhance.Color(_pil(x)).enhance(factor))
    _close(randaug.contrast(t, factor), ImageEnhance.Contrast(_pil(x)).enhance(factor))
    _close(randaug.brightness(t, factor), ImageEnhance.Brightness(_pil(x)).enhance(factor))
    _close(randaug.sharpness(t, factor), ImageEnhance.Sharpness(_pil(x)).enhance(factor))
  gray = _image(channels=1)
  _close(randaug.equalize(tf.constant(gray)), ImageOps.equalize(_pil(gray)), 0)
  _close(randaug.color(tf.constant(gray), 0.3), gray, 0)  # no colour to remove


def test_pixel_op_edge_cases():
  x = _image()
  t = tf.constant(x)
  np.testing.assert_array_equal(randaug.posterize(t, 8), x)
  np.testing.assert_array_equal(randaug.posterize(t, 0), 0)
  np.testing.assert_array_equal(randaug.solarize(t, 256), x)
  np.testing.assert_array_equal(randaug.solarize(t, 0), 255 - x)
  added = np.asarray(randaug.solarize_add(t, 110))
  np.testing.assert_array_equal(added[x >= 128], x[x >= 128])
  np.testing.assert_array_equal(added[x < 128], np.minimum(x[x < 128].astype(int) + 110, 255))
  flat = tf.fill([4, 4, 3], tf.constant(77, tf.uint8))
  np.testing.assert_array_equal(randaug.autocontrast(flat), 77)  # nothing to stretch
  np.testing.assert_array_equal(randaug.equalize(flat), 77)
  np.testing.assert_array_equal(randaug.brightness(t, 1.0), x)


def test_geometric_ops():
  x = _image(12, 12)
  t = tf.constant(x)
  np.testing.assert_array_equal(randaug.rotate(t, 90.0), np.rot90(x))  # counter-clockwise
  np.testing.assert_array_equal(randaug.rotate(t, 0.0), x)
  moved = np.asarray(randaug.translate_x(t, 3))
  np.testing.assert_array_equal(moved[:, 3:], x[:, :-3])
  np.testing.assert_array_equal(moved[:, :3], randaug.FILL)
  moved = np.asarray(randaug.translate_y(t, -2))
  np.testing.assert_array_equal(moved[:-2], x[2:])
  np.testing.assert_array_equal(moved[-2:], randaug.FILL)
  sheared = np.asarray(randaug.shear_x(t, 1.0))  # row y reads columns x + y
  for y in range(12):
    np.testing.assert_array_equal(sheared[y, :12 - y], x[y, y:])
    np.testing.assert_array_equal(sheared[y, 12 - y:], randaug.FILL)
  sheared = np.asarray(randaug.shear_y(t, 1.0))
  np.testing.assert_array_equal(sheared[:, 5][:7], x[5:, 5])
  cut = np.asarray(randaug.cutout(tf.zeros([20, 20, 3], tf.uint8), 3,
                                  tf.constant([1, 2], tf.int64)))
  side = np.flatnonzero(cut[..., 0].any(axis=0))
  assert 0 < cut[..., 0].astype(bool).sum() <= 36 and len(side) <= 6
  assert (cut[cut > 0] == randaug.FILL).all()


def test_every_op_runs_at_every_magnitude_and_keeps_shape_and_dtype():
  x = tf.constant(_image(16, 16))
  seed = tf.constant([3, 4], tf.int64)
  assert len(randaug.OPS) == 16
  for magnitude in (0, 10, 20):
    for index in range(len(randaug.OPS)):
      out = randaug.apply_op(x, tf.constant(index), magnitude, seed)
      assert out.shape == x.shape and out.dtype == tf.uint8, randaug.OPS[index]
  # Magnitude 0: the identity for the ops whose strength scales (shear, translate, rotate).
  for name in ('Rotate', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'SolarizeAdd'):
    out = randaug.apply_op(x, tf.constant(randaug.OPS.index(name)), 0, seed)
    np.testing.assert_array_equal(out, x, err_msg=name)


@pytest.mark.slow
def test_randaugment_is_seeded_and_runs_in_tf_data():
  x = tf.constant(_image(16, 16))
  a = randaug.randaugment(x, 2, 15, tf.constant([1, 2], tf.int64))
  b = randaug.randaugment(x, 2, 15, tf.constant([1, 2], tf.int64))
  np.testing.assert_array_equal(a, b)
  outs = [randaug.randaugment(x, 2, 15, tf.constant([1, s], tf.int64)).numpy()
          for s in range(8)]
  assert len({o.tobytes() for o in outs}) > 4
  np.testing.assert_array_equal(randaug.randaugment(x, 0, 15, tf.constant([1, 2], tf.int64)), x)
  with pytest.raises(UserError, match='num_layers'):
    randaug.randaugment(x, -1, 10, tf.constant([1, 2], tf.int64))

  spec = specs.train_spec('resize|randaug(num_layers=2, magnitude=10)', 16)
  images = tf.data.Dataset.from_tensors(x).repeat(4).enumerate().map(
      lambda i, im: preprocess.train_preprocess(im, tf.stack([tf.constant(0, tf.int64), i]),
                                                spec))
  batch = np.stack(list(images.as_numpy_iterator()))
  assert batch.shape == (4, 16, 16, 3) and batch.min() >= -1 and batch.max() <= 1
  plain = preprocess.train_preprocess(x, tf.constant([0, 0], tf.int64),
                                      specs.train_spec('resize', 16))
  assert not np.array_equal(batch[0], plain)
  with pytest.raises(UserError, match=r'^config.pp.train: randaug\(num_layers=1, '
                                      r'magnitude=-2\): magnitude=-2 must be a number >= 0'):
    specs.train_spec('resize|randaug(num_layers=1, magnitude=-2)', 16)
  # An AugReg recipe's train ops: randaug after the crop and the flip (seed slot 2).
  config = pretrain.get_config('model=B/16,dataset=imagenet21k,augreg=true,aug=medium2')
  spec = specs.of_config(config).train
  assert str(spec.ops) == 'inception_crop|flip|randaug(num_layers=2, magnitude=15)'
