"""FlexiViT (vit_jax/models/flexi.py): the pseudo-inverse resize of the patch kernel, the flexible
model against the plain ViT, and its options' checks."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import flexi
from helpers import cut_run, records


def _patchwise_resize(images: np.ndarray, p: int, q: int) -> np.ndarray:
  """Every p x p patch of `images` [B, H, W, C] bilinearly resized (jax.image.resize) to q x q."""
  b, h, w, c = images.shape
  patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  resized = jax.image.resize(jnp.asarray(patches), (b, h // p, w // p, q, q, c), 'bilinear',
                             antialias=False)
  return np.asarray(resized).transpose(0, 1, 3, 2, 4, 5).reshape(b, h // p * q, w // p * q, c)


def test_bilinear_matrix_is_jax_image_resize_without_antialiasing():
  # Up and down: the half-pixel bilinear resize of tf.image.resize (big_vision's choice).
  for n_in, n_out in ((4, 7), (8, 3), (5, 5), (3, 12), (12, 5)):
    basis = jnp.eye(n_in)[:, :, None, None]  # n_in signals of length n_in
    resized = jax.image.resize(basis, (n_in, n_out, 1, 1), 'bilinear', antialias=False)
    np.testing.assert_allclose(flexi.bilinear_matrix(n_in, n_out),
                               np.asarray(resized)[..., 0, 0].T, atol=1e-6)


@pytest.mark.parametrize('p, q', [(4, 4), (4, 6), (4, 7), (4, 8), (3, 10)])
def test_pi_resized_kernel_gives_the_same_tokens_on_the_resized_image(p, q):
  """The defining property (FlexiViT paper, Sec. 3.4): <x, w> = <B x, w'> for q >= p."""
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(p, p, 3, 5)).astype(np.float32)
  images = rng.uniform(-1, 1, size=(2, 3 * p, 2 * p, 3)).astype(np.float32)
  conv = lambda x, k, s: jax.lax.conv_general_dilated(
      jnp.asarray(x), k, (s, s), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=jax.lax.Precision.HIGHEST)
  tokens = conv(images, jnp.asarray(kernel), p)
  resized_kernel = flexi.pi_resize_kernel(jnp.asarray(kernel), (q, q))
  assert resized_kernel.shape == (q, q, 3, 5)
  resized_tokens = conv(_patchwise_resize(images, p, q), resized_kernel, q)
  np.testing.assert_allclose(resized_tokens, tokens, rtol=1e-4, atol=1e-4)


def test_pi_resize_is_the_pseudo_inverse_of_the_full_resize_matrix():
  """Resizing one axis at a time equals pinv(B^T) w with B the whole 2-D resize (non-square)."""
  rng = np.random.default_rng(1)
  kernel = rng.normal(size=(4, 5, 2, 3))
  for new in ((7, 3), (2, 8)):
    full = np.linalg.pinv(flexi.resize_matrix((4, 5), new).T)  # [new h*w, 4*5]
    expected = np.einsum('ai,icd->acd', full, kernel.reshape(20, 2, 3)).reshape(*new, 2, 3)
    got = flexi.pi_resize_kernel(jnp.asarray(kernel, jnp.float32), new)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _plain_params(classifier='token'):
  """ViT-Ze/4 at 28 px (a 7x7 grid) and its params with a non-zero head; the same tree is a
  FlexiViT's with a 4x4 kernel and a 7x7 position-embedding grid."""
  plain = models.create_model('ViT-Ze/4', num_classes=3, classifier=classifier)
  params = plain.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 3)), train=False)['params']
  params = jax.tree.map(np.array, params)
  params['head']['kernel'] = np.random.default_rng(0).normal(
      size=params['head']['kernel'].shape).astype(np.float32)  # non-zero logits
  return plain, params


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_flexi_model_at_its_stored_patch_size_is_the_plain_vit(classifier):
  plain, params = _plain_params(classifier)
  model = models.create_model('ViT-Ze/4', num_classes=3, classifier=classifier, flexi_patch=4,
                              flexi_grid=7)
  x = jax.random.uniform(jax.random.PRNGKey(1), (2, 28, 28, 3), minval=-1, maxval=1)
  shapes = jax.tree.map(np.shape, model.init(jax.random.PRNGKey(0), x, train=False)['params'])
  assert shapes == jax.tree.map(np.shape, params)
  expected = plain.apply({'params': params}, x, train=False)
  got = model.apply({'params': params}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(expected).max()) > 1e-2


def test_flexi_model_at_another_patch_size_is_the_plain_vit_on_resized_params():
  """ViT-Ze/7 with a stored 4x4 kernel and 7x7 grid (28 px: a 4x4 grid) equals the plain ViT-Ze/7
  whose kernel is pinv(B^T) w (B from resizing basis patches) and whose position embedding is
  the stored grid resized by jax.image.resize (the cls row kept)."""
  _, flexi_params = _plain_params('token')
  kernel = flexi_params['embedding']['kernel']  # [4, 4, 3, 32]
  basis = np.eye(16).reshape(16, 4, 4, 1)
  b = np.asarray(jax.image.resize(jnp.asarray(basis), (16, 7, 7, 1), 'bilinear',
                                  antialias=False)).reshape(16, 49).T  # [49, 16]: x' = B x
  resized_kernel = (np.linalg.pinv(b.T) @ kernel.reshape(16, -1)).reshape(7, 7, 3, 32)
  pe = flexi_params['Transformer']['posembed_input']['pos_embedding']  # [1, 1 + 49, 32]
  resized_pe = np.asarray(jax.image.resize(jnp.asarray(pe[:, 1:].reshape(1, 7, 7, 32)),
                                           (1, 4, 4, 32), 'bilinear'))
  reference = jax.tree.map(lambda x: x, flexi_params)
  reference['embedding']['kernel'] = resized_kernel.astype(np.float32)
  reference['Transformer']['posembed_input'] = {'pos_embedding': np.concatenate(
      [pe[:, :1], resized_pe.reshape(1, 16, 32)], axis=1)}
  x = jax.random.uniform(jax.random.PRNGKey(2), (2, 28, 28, 3), minval=-1, maxval=1)
  expected = models.create_model('ViT-Ze/7', num_classes=3).apply(
      {'params': reference}, x, train=False)
  model = models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=4, flexi_grid=7)
  got = model.apply({'params': flexi_params}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('options, error', [
    (dict(flexi_patch=-1), 'model.flexi_patch=-1 is out of range: it must be an integer >= 0'),
    (dict(flexi_grid=2.5), 'model.flexi_grid=2.5 is out of range: it must be an integer >= 0'),
    (dict(flexi_resize='area'), "unknown flexi_resize 'area': use model.flexi_resize= one of"),
    (dict(flexi_grid=7, posemb='sincos2d'),
     "model.flexi_grid=7 resizes a learned position embedding but model.posemb='sincos2d'"),
])
def test_bad_flexi_options_are_one_line_errors(options, error):
  with pytest.raises(UserError, match='^' + error.replace('(', r'\(').replace('.', r'\.')):
    models.create_model('ViT-Ze/4', num_classes=3, **options)


# ---------------------------------------------------------------- training and evaluation


def test_flexi_patch_sizes_are_drawn_by_seed_and_step_with_their_weights():
  from vit_jax.train import patch_sizes  # pylint: disable=g-import-not-at-top
  draws = [patch_sizes.draw((4, 7, 14), (1, 0, 3), 0, s) for s in range(1, 401)]
  assert draws == [patch_sizes.draw((4, 7, 14), (1, 0, 3), 0, s) for s in range(1, 401)]
  assert 7 not in draws and 0.65 < draws.count(14) / len(draws) < 0.85
  assert draws != [patch_sizes.draw((4, 7, 14), (1, 0, 3), 1, s) for s in range(1, 401)]


@pytest.mark.parametrize('overrides, error', [
    (dict(flexi_patch_sizes=(4, 7)), 'config.flexi_patch_sizes=4,7 draws a patch size per step, '
     'which needs a FlexiViT: set config.model.flexi_patch'),
    (dict(flexi_patch_sizes=(4, 5), flexi_patch=7),
     'config.flexi_patch_sizes has 5, which does not divide the 28 px images'),
    (dict(flexi_patch_sizes=(4, 7), flexi_patch_probs=(1,), flexi_patch=7),
     'config.flexi_patch_probs=1 must be one weight >= 0 per patch size (2)'),
    (dict(flexi_patch_probs=(1, 2)), 'config.flexi_patch_probs is set but config.flexi_patch_sizes'
     ' is empty'),
    (dict(flexi_patch_sizes=(4, 7), flexi_patch=7, flexi_grid=0),
     'config.flexi_patch_sizes changes the token grid, which a learned position embedding of one '
     'grid cannot follow: set config.model.flexi_grid'),
])
def test_bad_flexi_training_configs_are_one_line_errors(overrides, error):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.train import validate  # pylint: disable=g-import-not-at-top
  config = common.base_config()
  config.model_name, config.image_size = 'ViT-Ze/7', 28
  config.model.flexi_patch = overrides.pop('flexi_patch', 0)
  config.model.flexi_grid = overrides.pop('flexi_grid', 4)
  config.model.posemb = 'learned'
  for key, value in overrides.items():
    config[key] = value
  with pytest.raises(UserError) as e:
    validate.check_config(config)
  assert str(e.value).startswith(error), str(e.value)


STEPS = 8
TIMINGS = ('img_per_s', 'mfu')  # of a metrics record: measured, not computed


def _run_config(data_dir):
  """A tiny FlexiViT on mnist5k: ViT-Ze/7 at 28 px with a stored 14x14 kernel and 4x4 grid,
  patch sizes 4, 7 and 14 drawn (weights 1, 1, 2), dropout on (the step RNG must resume too);
  `eval` scored at every drawn size (its patch_sizes unset), `own` at the model's own only."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config(f'model_name=ViT-Ze/7,steps={STEPS},batch_size=8')
  config.warmup_steps, config.progress, config.log_every, config.data_dir = 1, False, 1, data_dir
  config.eval_every, config.checkpoint_every = STEPS, STEPS // 2
  config.model.flexi_patch, config.model.flexi_grid, config.model.dropout_rate = 14, 4, 0.1
  config.flexi_patch_sizes, config.flexi_patch_probs = (4, 7, 14), (1, 1, 2)
  config.evals.own = dict(type='top1', patch_sizes=())
  return config


def _train(workdir, data_dir):
  """Trains (or resumes) the run in `workdir`: (its final metrics, [(step, patch size drawn)],
  the patch size of each step that ran a train step of its own size)."""
  from vit_jax.train import loop, patch_sizes, program  # pylint: disable=g-import-not-at-top
  drawn, built = [], []
  draw, train_fn_at = patch_sizes.draw, program.Program.train_fn_at

  def recording_draw(sizes, probs, seed, step):
    drawn.append((step, draw(sizes, probs, seed, step)))
    return drawn[-1][1]

  def recording_build(self, p):
    built.append(p)
    return train_fn_at(self, p)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(patch_sizes, 'draw', recording_draw)
    patch.setattr(program.Program, 'train_fn_at', recording_build)
    result = loop.train_and_evaluate(_run_config(data_dir), str(workdir))
  return result, drawn, built


@pytest.fixture(scope='module')
def flexi_run(tmp_path_factory, data_dir):
  """The uninterrupted run."""
  workdir = tmp_path_factory.mktemp('flexi') / 'run'
  result, drawn, built = _train(workdir, data_dir)
  return {'workdir': str(workdir), 'result': result, 'drawn': drawn, 'built': built}


def _accuracy_at(workdir, step, p):
  """Top-1 of checkpoint `step` at patch size p on mnist5k's 1,000 test images, outside the eval
  pipeline: the images straight from their arrays, one forward pass of the model at p."""
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  from vit_jax.data import mnist5k as mnist5k_data  # pylint: disable=g-import-not-at-top
  images, labels = mnist5k_data.load_arrays()
  test = mnist5k_data.split_indices(labels)['test']
  x = (images[test].astype(np.float32) - 127.5) / 127.5
  params, _ = inputs.load_checkpoint(f'{workdir}/checkpoints/{step}')
  model = models.create_model('ViT-Ze/7', num_classes=10, flexi_patch=14, flexi_grid=4,
                              patch_size=p)
  logits = jax.jit(lambda x: model.apply({'params': params}, x, train=False))(x)
  return float(np.mean(np.argmax(logits, -1) == labels[test]))


def test_periodic_evaluations_score_every_patch_size_the_run_draws(flexi_run):
  """`eval` (patch_sizes unset) logs its metrics at the model's own patch size 7 as they are and
  at each drawn size as metric@pP, each equal to a plain forward pass at that size; `own`
  (patch_sizes=()) only the own size's."""
  evals = records(flexi_run['workdir'], 'eval')
  assert [r['step'] for r in evals] == [STEPS]
  assert set(evals[-1]) == {'step', 'split'} | {f'{m}{at}' for m in ('accuracy', 'loss', 'count')
                                                for at in ('', '@p4', '@p7', '@p14')}
  own = records(flexi_run['workdir'], 'own')
  assert [r['step'] for r in own] == [STEPS]
  assert set(own[-1]) == {'step', 'split', 'accuracy', 'loss', 'count'}
  last = evals[-1]
  assert last['accuracy@p7'] == last['accuracy'] == own[-1]['accuracy']
  assert last['count@p4'] == last['count@p14'] == 1000
  for p in (4, 7, 14):
    assert last[f'accuracy@p{p}'] == pytest.approx(_accuracy_at(flexi_run['workdir'], STEPS, p),
                                                   abs=2e-3), p
  assert len({last['loss@p4'], last['loss@p7'], last['loss@p14']}) == 3
  assert flexi_run['result'] == {k: v for k, v in last.items() if k not in ('step', 'split')}


def test_bad_evaluation_patch_sizes_are_one_line_errors():
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.train import validate  # pylint: disable=g-import-not-at-top
  cases = [
      (dict(patch_sizes=(4, 5)), 'config.evals.eval.patch_sizes has 5, which does not divide the '
       '28 px images into patches: use divisors of 28'),
      (dict(patch_sizes=4, entry='near'),  # an entry of a config file: any value
       'config.evals.near.patch_sizes=4 must be a list of patch sizes'),
      (dict(patch_sizes=(4,), flexi_patch=0), 'config.evals.eval.patch_sizes=4 scores the model '
       'at those patch sizes, which needs a FlexiViT: set config.model.flexi_patch'),
      (dict(patch_sizes=(4,), flexi_grid=0), 'config.evals.eval.patch_sizes changes the token '
       'grid, which a learned position embedding of one grid cannot follow'),
  ]
  for overrides, error in cases:
    config = common.base_config()
    config.model_name, config.image_size, config.model.posemb = 'ViT-Ze/7', 28, 'learned'
    config.model.flexi_patch = overrides.get('flexi_patch', 14)
    config.model.flexi_grid = overrides.get('flexi_grid', 4)
    if 'entry' in overrides:
      config.evals[overrides['entry']] = dict(type='knn', patch_sizes=overrides['patch_sizes'])
    else:
      config.evals.eval.patch_sizes = overrides['patch_sizes']
    with pytest.raises(UserError) as e:
      validate.check_config(config)
    assert str(e.value).startswith(error), str(e.value)
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config.evals.near = dict(type='knn', patch_sizes=(4, 14))
  registry.check(config)  # an option of every evaluator type (knn too)


def test_a_killed_flexivit_run_resumes_with_the_same_draws_params_and_metrics(
    flexi_run, data_dir, tmp_path):
  """The run cut back to its step-4 checkpoint (as a kill leaves it; helpers.cut_run) and rerun
  draws steps 5-8's patch sizes as the whole run did and ends with its params bit for bit and its
  logged metrics."""
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  full, cut = flexi_run['workdir'], str(tmp_path / 'cut')
  cut_run(full, cut, keep_step=4, drop_step=8)
  result, drawn, _ = _train(cut, data_dir)
  assert [s for s, _ in flexi_run['drawn']] == list(range(1, STEPS + 1))
  assert drawn == flexi_run['drawn'][4:]
  assert len({p for _, p in drawn}) > 1  # the resumed steps ran at more than one size
  whole, again = (inputs.load_checkpoint(f'{w}/checkpoints/{STEPS}')[0] for w in (full, cut))
  jax.tree.map(np.testing.assert_array_equal, whole, again)
  untimed = lambda w: [{k: v for k, v in r.items() if k not in TIMINGS} for r in records(w)]
  assert untimed(cut) == untimed(full)
  assert result == flexi_run['result']


def test_a_flexivit_trained_with_random_patch_sizes_evaluates_at_two_from_one_checkpoint(
    flexi_run, tmp_path):
  """The run's steps (seed 0 draws 14, 4, 14, 14, 7, 7, 4, 14: the sizes other than the model's
  own 7 run their own step, the own size the step compiled at the start), then its one checkpoint
  scored by the evaluate command's function as the run's own evaluation scored it: at
  --patch_size=4 into a table of its own, and with the entries' patch_sizes set, top-1 at 4 and 14
  and k-NN at 4 (its features cached apart from the own size's) into the checkpoint's table."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import checkpoint  # pylint: disable=g-import-not-at-top
  assert [p for _, p in flexi_run['drawn']] == [14, 4, 14, 14, 7, 7, 4, 14]
  assert flexi_run['built'] == [14, 4, 14, 14, 4, 14]
  model, params, config, identity = checkpoint.load_run_checkpoint(flexi_run['workdir'], None)
  assert params['embedding']['kernel'].shape == (14, 14, 1, 32)  # stored once, at flexi_patch
  logged = records(flexi_run['workdir'], 'eval')[-1]
  quiet = dict(workdir=str(tmp_path), say=lambda line: None)

  out = checkpoint.evaluate(flexi.at_patch_size(model, 4, 28), params, config,
                            dict(identity, patch_size=4), ['eval'], **quiet)
  assert out['directory'].endswith(f'/evaluations/step_{STEPS}_patch4')
  at4 = out['results']['eval']['metrics']
  assert set(at4) == {'accuracy', 'loss', 'count'}  # --patch_size: one size, plain names
  assert at4['accuracy'] == pytest.approx(logged['accuracy@p4'], abs=1e-6)
  assert at4['loss'] == pytest.approx(logged['loss@p4'], rel=1e-5)

  config = ml_collections.ConfigDict(config.to_dict())
  config.evals.eval.patch_sizes, config.evals.knn.patch_sizes = (4, 14), (4,)
  config.evals.knn.train_split = 'test'  # (its neighbours among the 1,000 test images: cheap)
  out = checkpoint.evaluate(model, params, config, identity, ['eval', 'knn'], **quiet)
  assert out['directory'].endswith(f'/evaluations/step_{STEPS}')
  top1, knn = (out['results'][name]['metrics'] for name in ('eval', 'knn'))
  for key in ('accuracy', 'accuracy@p4', 'accuracy@p14', 'loss@p4', 'loss@p14'):
    assert top1[key] == pytest.approx(logged[key], rel=1e-5), key
  assert top1['loss@p4'] != top1['loss@p14']  # two models from one checkpoint
  assert sorted(knn) == ['top1', 'top1@p4', 'top5', 'top5@p4'] and knn['top1'] != knn['top1@p4']
  assert len(os.listdir(tmp_path / 'features')) == 2  # the test split's at 7 and at 4


def test_running_at_a_patch_size_needs_a_flexivit_and_a_divisor_of_the_image():
  plain = models.create_model('ViT-Ze/7', num_classes=3)
  with pytest.raises(UserError, match=r'^--patch_size=4 runs a FlexiViT at another patch size, '
                     r'but this model stores its patch kernel at its own patch size'):
    flexi.at_patch_size(plain, 4, 28)
  fixed_grid = models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=14)
  with pytest.raises(UserError, match=r'^--patch_size=4 changes the token grid, but this '
                     r"FlexiViT's learned position embedding is stored for its own grid"):
    flexi.at_patch_size(fixed_grid, 4, 28)
  model = models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=14, flexi_grid=4)
  with pytest.raises(UserError, match=r'^--patch_size=5 does not divide the 28 px images'):
    flexi.at_patch_size(model, 5, 28)
  assert flexi.at_patch_size(model, 4, 28).patch == (4, 4)
  assert models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=14, patch_size=4).patch == (
      4, 4)  # the same model by the patch_size option (what a bundle's spec stores)


# ---------------------------------------------------------------- big_vision's FlexiViT files


def _big_vision_flexivit(path, rng):
  """A tiny FlexiViT .npz in big_vision's layout (models/proj/flexi/vit.py: `embedding` kernel
  8x8, a top-level `pos_embedding` [1, 4*4, D] without a cls row, `cls`, linen encoder names,
  everything under `params/`); returns its flat arrays."""
  params = models.create_model('ViT-Ze/8', num_classes=5).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False)['params']
  flat = {'/'.join(k.key for k in keys): rng.normal(size=x.shape).astype(np.float32) * 0.3
          for keys, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  del flat['Transformer/posembed_input/pos_embedding']
  flat['pos_embedding'] = rng.normal(size=(1, 16, 32)).astype(np.float32)
  for key in [k for k in flat if k.endswith('scale')]:
    flat[key] = 1. + flat[key]
  np.savez(path, **{f'params/{k}': v for k, v in flat.items()})
  return flat


def _np_flexivit(bv, images, p):
  """big_vision's FlexiViT at patch size p by its definition (FlexiViT paper, Sec. 3.4): the kernel
  pinv(B^T) w with B the bilinear resize of basis patches, the position embedding resized to the
  token grid and added to the patch tokens before cls is prepended (the numpy ViT of
  tests/test_models.py runs the rest)."""
  from test_models import _np_vit  # pylint: disable=g-import-not-at-top
  base, d = bv['embedding/kernel'].shape[0], bv['embedding/kernel'].shape[-1]
  basis = np.eye(base * base).reshape(-1, base, base, 1)
  b = np.asarray(jax.image.resize(jnp.asarray(basis), (base * base, p, p, 1), 'bilinear',
                                  antialias=False)).reshape(base * base, p * p).T
  kernel = np.linalg.pinv(b.T) @ bv['embedding/kernel'].astype(np.float64).reshape(base * base, -1)
  g = images.shape[1] // p
  pe = np.asarray(jax.image.resize(jnp.asarray(bv['pos_embedding'].reshape(1, 4, 4, d)),
                                   (1, g, g, d), 'bilinear')).reshape(1, g * g, d)
  tree = {}
  for key, value in bv.items():
    node = tree
    *parents, leaf = key.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  tree['embedding'] = {'kernel': kernel.reshape(p, p, 3, d), 'bias': bv['embedding/bias']}
  tree['Transformer']['posembed_input'] = {
      'pos_embedding': np.concatenate([np.zeros((1, 1, d)), pe], axis=1)}
  return _np_vit(tree, images, p, heads=2)


def test_a_big_vision_flexivit_file_loads_with_its_logits_at_every_patch_size(tmp_path):
  from vit_jax.formats import npz  # pylint: disable=g-import-not-at-top
  from vit_jax.models import spec  # pylint: disable=g-import-not-at-top
  bv = _big_vision_flexivit(tmp_path / 'flexi.npz', np.random.default_rng(0))
  params = npz.load_npz(str(tmp_path / 'flexi.npz'))
  options = spec.infer_options(params, 'ViT-Ze/16')
  assert options == {'classifier': 'token', 'flexi_patch': 8, 'flexi_grid': 4}
  images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  outputs = []
  for p in (16, 8, 4):  # up, equal and down from the stored 8x8 kernel
    model = models.create_model('ViT-Ze/16', num_classes=5, **options, patch_size=p)
    outputs.append(model.apply({'params': params}, images, train=False))
    np.testing.assert_allclose(outputs[-1], _np_flexivit(bv, images, p), rtol=2e-4, atol=2e-4)
  assert min(float(np.abs(a - b).max()) for a, b in zip(outputs, outputs[1:])) > 1e-2


def test_flexivit_weights_by_name_come_from_big_vision(tmp_path, monkeypatch):
  from vit_jax.formats import weights  # pylint: disable=g-import-not-at-top
  w = weights.lookup('ViT-B/16@flexivit-i21k-300ep')
  assert (w.model_name, w.image_size, weights.url(w)) == (
      'ViT-B/16', 240,
      'https://storage.googleapis.com/big_vision/flexivit/flexivit_b_i21k_300ep.npz')
  assert {n for n in weights.KNOWN if '@flexivit' in n} == {
      'ViT-S/16@flexivit-i1k', 'ViT-B/16@flexivit-i1k', 'ViT-L/16@flexivit-i1k',
      'ViT-B/16@flexivit-i21k-90ep', 'ViT-B/16@flexivit-i21k-300ep',
      'ViT-B/16@flexivit-i21k-1000ep'}
  mirror = tmp_path / 'mirror' / 'big_vision' / 'flexivit'
  mirror.mkdir(parents=True)
  np.savez(mirror / 'flexivit_s_i1k.npz', x=np.zeros(3))
  monkeypatch.setenv(weights.URL_VAR, f'file://{tmp_path / "mirror"}')
  monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
  path = weights.fetch('ViT-S/16@flexivit-i1k')
  assert path == str(tmp_path / 'cache' / 'big_vision' / 'flexivit' / 'flexivit_s_i1k.npz')
  with pytest.raises(UserError, match=r'holds another model \(width None, None blocks\), not '
                     r'ViT-S/16@flexivit-i1k \(ViT-S/16: width 384, 12 blocks\)'):
    weights.check_model('ViT-S/16@flexivit-i1k', path)


def test_a_flexivit_params_file_takes_its_image_size_from_the_flag_that_its_error_names(tmp_path):
  """A FlexiViT file's position embedding is of its own grid, so the file does not give its image
  size: the error names --image_size, and that size (evaluate's and analyze's flag) loads it."""
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import checkpoint  # pylint: disable=g-import-not-at-top
  _big_vision_flexivit(tmp_path / 'flexi.npz', np.random.default_rng(0))
  path = str(tmp_path / 'flexi.npz')
  with pytest.raises(UserError, match=r'its image size is not stored: pass --image_size$'):
    inputs.load_params_file(path, 'ViT-Ze/16')
  _, _, spec = inputs.load_params_file(path, 'ViT-Ze/16', 32)
  assert (spec.image_size, spec.options['flexi_grid']) == (32, 4)
  model, _, config, _ = checkpoint.load_weights(path, 'ViT-Ze/16', 'mnist5k', 32)
  assert config.image_size == 32 and model.patch == (16, 16)


# ---------------------------------------------------------------- export at a patch size


def test_a_flexivit_exports_at_the_patch_size_given_to_the_export_command(tmp_path, capsys):
  """`python -m vit_jax export --format=stablehlo,onnx --patch_size=P` (the command's `run`, in
  process) of a big_vision FlexiViT file, for P below and above its stored 8x8 kernel (its 4x4
  position-embedding grid enlarged and shrunk): each written program, run from its file
  (jax.export.deserialize; onnxruntime), gives the numpy FlexiViT's logits at P, and the bundle's
  model.json runs at P."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from vit_jax.commands import export  # pylint: disable=g-import-not-at-top
  from vit_jax.serving import bundle as bundle_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.serving import exported  # pylint: disable=g-import-not-at-top
  from vit_jax.serving import onnx as onnx_export  # pylint: disable=g-import-not-at-top
  from vit_jax.serving import stablehlo  # pylint: disable=g-import-not-at-top
  bv = _big_vision_flexivit(tmp_path / 'flexi.npz', np.random.default_rng(0))
  pixels = np.random.default_rng(2).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
  x = (pixels.astype(np.float32) - 127.5) / 127.5
  exports = {}
  for p in (4, 16):
    out = tmp_path / f'bundle{p}'
    capsys.readouterr()
    with flagsaver.flagsaver():
      flags.FLAGS(['export', f'--checkpoint={tmp_path / "flexi.npz"}', '--model=ViT-Ze/16',
                   '--image_size=32', f'--patch_size={p}', f'--out={out}',
                   '--format=stablehlo,onnx'])
      assert export.run(['export']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(':')[0] for line in lines] == [
        f'wrote {out}', f'wrote {out / "model.stablehlo"}', f'wrote {out / "model.onnx"}']
    assert all(float(line.split('relative error ')[1].rstrip(')')) <= exported.TOLERANCE
               for line in lines[1:])  # the export's own check passed
    assert bundle_lib.load(str(out)).spec.build().patch == (p, p)
    want = _np_flexivit(bv, x, p)
    got = {'stablehlo': np.asarray(stablehlo.load_and_run(str(out / 'model.stablehlo'),
                                                           pixels)[1]),
           'onnx': onnx_export.runtime(str(out / 'model.onnx')).run(
               ['logits'], {'images': pixels})[0]}
    for name, logits in got.items():
      error = exported.relative_error(logits, want)
      print(f'{name} at patch {p}: relative error {error:.1e} against the numpy FlexiViT')
      assert logits.shape == (2, 5) and error < 1e-4, (name, p, error)
    exports[p] = got['stablehlo']
  assert float(np.abs(exports[4] - exports[16]).max()) > 1e-2  # two programs, not one


def test_a_flexivit_initialises_its_kernel_and_position_embedding_as_big_vision():
  """normal(1/sqrt(width)) for the stored patch kernel and learned position embedding (big_vision's
  models/proj/flexi/vit.py); the plain ViT keeps the original's lecun-normal kernel and 0.02."""
  x = jnp.zeros((1, 28, 28, 3))
  flexi_params = models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=14, flexi_grid=7).init(
      jax.random.PRNGKey(0), x, train=False)['params']
  plain_params = models.create_model('ViT-Ze/7', num_classes=3).init(
      jax.random.PRNGKey(0), x, train=False)['params']
  std = lambda params, *path: float(np.std(functools.reduce(lambda n, k: n[k], path, params)))
  pe = ('Transformer', 'posembed_input', 'pos_embedding')
  width = 32
  assert std(flexi_params, 'embedding', 'kernel') == pytest.approx(width ** -0.5, rel=0.05)
  assert std(flexi_params, *pe) == pytest.approx(width ** -0.5, rel=0.1)  # 50 x 32 draws
  assert std(plain_params, 'embedding', 'kernel') == pytest.approx((7 * 7 * 3) ** -0.5, rel=0.15)
  assert std(plain_params, *pe) == pytest.approx(0.02, rel=0.1)
