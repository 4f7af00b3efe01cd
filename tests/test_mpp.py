"""Masked patch prediction: targets, corruption statistics, the model hook, the objective."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from vit_jax.configs import common
from vit_jax import models
from vit_jax.errors import UserError
from vit_jax import tasks
from vit_jax.tasks import mpp


def test_colour_targets_match_numpy():
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, size=(2, 8, 12, 3)).astype(np.float32)
  got = np.asarray(mpp.colour_targets(jnp.asarray(images), (4, 4)))
  assert got.shape == (2, 6)
  for b in range(2):
    for i in range(2):
      for j in range(3):
        patch = (images[b, 4 * i:4 * i + 4, 4 * j:4 * j + 4] + 1) / 2
        level = np.minimum(7, np.floor(patch.reshape(-1, 3).mean(0) * 8)).astype(int)
        assert got[b, i * 3 + j] == level[0] * 64 + level[1] * 8 + level[2]
  # Known values: black is class 0, white the last of 8**C, gray levels on one channel.
  assert int(mpp.colour_targets(-jnp.ones((1, 4, 4, 3)), (4, 4))[0, 0]) == 0
  assert int(mpp.colour_targets(jnp.ones((1, 4, 4, 3)), (4, 4))[0, 0]) == 511
  gray = jnp.asarray([[-1.0, -0.5], [0.0, 0.99]])[None, :, :, None]
  np.testing.assert_array_equal(mpp.colour_targets(gray, (1, 1))[0], [0, 2, 4, 7])
  assert mpp.num_colour_classes(3) == 512 and mpp.num_colour_classes(1) == 8


def test_corruption_statistics():
  c = mpp.sample_corruption(jax.random.PRNGKey(0), 4000, 50)
  selected, use_mask, source = (np.asarray(c[k]) for k in ('selected', 'use_mask', 'source'))
  assert (selected.sum(1) == 25).all()  # exactly half of the patches of every image
  positions = np.arange(50)
  swapped = source != positions
  assert not (use_mask & ~selected).any() and not (swapped & ~selected).any()
  assert not (use_mask & swapped).any()
  n = selected.sum()
  np.testing.assert_allclose(use_mask.sum() / n, 0.8, atol=0.01)
  np.testing.assert_allclose(swapped.sum() / n, 0.1, atol=0.01)  # always another position
  assert ((source >= 0) & (source < 50)).all()
  # The replacement patch is uniform over the other 49 positions.
  offsets = ((source - positions) % 50)[swapped]
  counts = np.bincount(offsets, minlength=50)
  assert counts[0] == 0 and counts[1:].min() > 0.5 * counts[1:].mean()


def _init(model, x):
  return jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x)['params']


@pytest.mark.slow
def test_mask_token_exists_only_when_asked_and_corrupts_embeddings():
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)), jnp.float32)
  plain = models.create_model('ViT-Ze/4', num_classes=5)
  params = jax.eval_shape(lambda: plain.init(jax.random.key(0), x, train=False))['params']
  assert 'mask_token' not in params  # the official param tree is unchanged
  model = models.create_model('ViT-Ze/4', num_classes=5, classifier='unpooled',
                              with_mask_token=True)
  params = _init(model, x)
  assert params['mask_token'].shape == (1, 1, 32)
  identity = {'source': jnp.tile(jnp.arange(4), (2, 1)), 'use_mask': jnp.zeros((2, 4), bool)}
  apply = jax.jit(lambda p, x, corrupt: model.apply({'params': p}, x, train=False,
                                                    corrupt=corrupt))
  # (a random head, so that the logits depend on the features)
  kernel = jax.random.normal(jax.random.key(1), params['head']['kernel'].shape)
  params = dict(params, head={'kernel': kernel, 'bias': params['head']['bias']})
  out = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(params, x)
  np.testing.assert_allclose(apply(params, x, identity), out, rtol=1e-5, atol=1e-5)
  # Every patch masked: the output no longer depends on the image.
  masked = dict(identity, use_mask=jnp.ones((2, 4), bool))
  np.testing.assert_allclose(apply(params, x, masked), apply(params, x[::-1], masked), atol=1e-5)
  # Swapping patches 0 <-> 1 of image 0 equals feeding the image with those patches swapped.
  swap = dict(identity, source=identity['source'].at[0, :2].set(jnp.array([1, 0])))
  x_swapped = x.at[0, :4, :4].set(x[0, :4, 4:]).at[0, :4, 4:].set(x[0, :4, :4])
  np.testing.assert_allclose(apply(params, x, swap), apply(params, x_swapped, identity),
                             atol=1e-5)
  assert not np.allclose(apply(params, x, swap), out, atol=1e-2)


def _config(**overrides):
  c = common.base_config()
  c.loss = 'mpp'
  c.image_size = 8
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.slow
def test_objective_scores_only_the_corrupted_patches():
  c = _config()
  model = models.create_model('ViT-Ze/4', num_classes=8, **tasks.get_task(c).model_overrides)
  x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (3, 8, 8, 1)), jnp.float32)
  params = _init(model, x)
  objective = jax.jit(tasks.get_task(c).objective(model, 8))
  rng = jax.random.PRNGKey(3)
  loss, correct = objective({'params': params}, x, jnp.zeros(3, jnp.int32), rng)
  # Reference: the same corruption, softmax cross-entropy averaged over the selected patches.
  corrupt_rng, _ = jax.random.split(rng)
  c4 = mpp.sample_corruption(corrupt_rng, 3, 4)
  logits = jax.jit(lambda p, x, c: model.apply({'params': p}, x, train=False, corrupt=c))
  logits = np.asarray(logits(params, x, c4))[:, 1:]
  targets = np.asarray(mpp.colour_targets(x, (4, 4)))
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  xent = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  sel = np.asarray(c4['selected'])
  np.testing.assert_allclose(loss, np.mean((xent * sel).sum(1) / sel.sum(1)), rtol=1e-5)
  hits = (logits.argmax(-1) == targets) * sel
  np.testing.assert_allclose(correct, (hits.sum(1) / sel.sum(1)).sum(), rtol=1e-6)


def test_bad_settings():
  with pytest.raises(UserError, match='mpp.ratio'):
    mpp.check(_config(mpp=ml_collections.ConfigDict(
        {'ratio': 0.0, 'mask_prob': 0.8, 'random_prob': 0.1})), (7, 7))
  with pytest.raises(UserError, match='sum <= 1'):
    mpp.check(_config(mpp=ml_collections.ConfigDict(
        {'ratio': 0.5, 'mask_prob': 0.8, 'random_prob': 0.3})), (7, 7))
  with pytest.raises(UserError, match='mixup'):
    mpp.check(_config(mixup=0.2), (7, 7))
  with pytest.raises(UserError, match='at least 2 patches'):
    mpp.check(_config(), (1, 1))
  with pytest.raises(UserError, match='softmax_xent, mpp'):
    tasks.get_task(_config(loss='mse'))
