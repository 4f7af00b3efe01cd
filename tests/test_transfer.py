"""Transfer (`config.init`): posemb resize, head reset, pre_logits drop (pre-train -> fine-tune
end to end: tests/test_pretrain_finetune.py)."""

import jax
import ml_collections
import numpy as np
import pytest
import scipy.ndimage

from vit_jax.configs import finetune
from vit_jax import models
from vit_jax import parallel
from vit_jax import tasks
from vit_jax.formats import npz as npz_lib
from vit_jax.models import posemb_resize
from vit_jax.train import transfer
from vit_jax.errors import UserError
from vit_jax.train import optim, program

POSEMB = npz_lib.POSEMB


# ---------------------------------------------------------------- posemb resize


@pytest.mark.parametrize('old, new', [((4, 4), (7, 7)), ((7, 7), (3, 3)), ((3, 5), (6, 4)),
                                      ((2, 6), (5, 9)), ((5, 5), (5, 5))])
def test_bilinear_equals_the_originals_scipy_zoom_order_1(old, new):
  rng = np.random.default_rng(0)
  grid = rng.normal(size=old + (3,))
  posemb = np.concatenate([rng.normal(size=(1, 3)), grid.reshape(-1, 3)])[None]
  out = posemb_resize.resize_posemb(posemb, old, new, has_cls=True, method='bilinear')
  # The original code (`checkpoint.py`, `load_pretrained`): scipy.ndimage.zoom(grid, (new/old, new/old, 1),
  # order=1) on the grid; zooming by the size ratio gives exactly the requested output shape.
  zoom = (new[0] / old[0], new[1] / old[1], 1)
  expected = scipy.ndimage.zoom(grid, zoom, order=1)
  assert expected.shape == new + (3,)
  np.testing.assert_allclose(out[0, 0], posemb[0, 0])  # the cls row is kept as it is
  np.testing.assert_allclose(out[0, 1:].reshape(new + (3,)), expected, rtol=1e-6, atol=1e-6)


def test_known_grid_values():
  # A 2x2 grid upsampled to 3x3 (corner-aligned): corners kept, edges the mean of two corners,
  # the centre the mean of all four.
  grid = np.array([[0., 4.], [8., 12.]])[..., None]
  out = posemb_resize.resize_posemb(grid.reshape(1, 4, 1), (2, 2), (3, 3), has_cls=False)
  np.testing.assert_allclose(out.reshape(3, 3), [[0, 2, 4], [4, 6, 8], [8, 10, 12]])
  # 5 rows -> 3 rows: rows 0, 2, 4 are sampled exactly.
  rows = np.arange(5.)[:, None, None] * np.ones((1, 2, 1))
  down = posemb_resize.resize_posemb(rows.reshape(1, 10, 1), (5, 2), (3, 2), has_cls=False)
  np.testing.assert_allclose(down.reshape(3, 2), [[0, 0], [2, 2], [4, 4]])


def test_bicubic_interpolates_and_reproduces_quadratics():
  w = posemb_resize.interpolation_matrix(5, 9, 'bicubic')
  np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)  # partition of unity
  np.testing.assert_allclose(w[::2], np.eye(5), atol=1e-12)  # old nodes are sampled exactly
  # Keys' kernel (a = -0.5) reproduces polynomials up to degree 2 where no edge sample repeats.
  x_old = np.arange(8.)
  values = 0.5 * x_old ** 2 - 3 * x_old + 1
  w = posemb_resize.interpolation_matrix(8, 15, 'bicubic')
  x_new = np.arange(15) * 7 / 14
  inner = (x_new >= 1) & (x_new <= 6)
  np.testing.assert_allclose((w @ values)[inner], (0.5 * x_new ** 2 - 3 * x_new + 1)[inner],
                             atol=1e-9)
  # On a curved grid, bicubic differs from bilinear (which is exact only for linear functions).
  lin = posemb_resize.interpolation_matrix(8, 15, 'bilinear') @ values
  assert np.max(np.abs(lin - w @ values)) > 0.01


def test_resize_errors():
  with pytest.raises(UserError, match='bilinear, bicubic'):
    posemb_resize.interpolation_matrix(3, 4, 'nearest')
  with pytest.raises(UserError, match='not 1 \\+ 3x3'):
    posemb_resize.resize_posemb(np.zeros((1, 9, 2)), (3, 3), (4, 4), has_cls=True)
  with pytest.raises(UserError, match='not a square'):
    posemb_resize.square_grid(12)
  assert posemb_resize.square_grid(49) == (7, 7)


# ---------------------------------------------------------------- which params transfer


def _abstract(model, size, channels=1):
  x = jax.ShapeDtypeStruct((1, size, size, channels), np.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False)['params'], x)


def _numpy_params(model, size, seed=0, channels=1):
  x = np.zeros((1, size, size, channels), np.float32)
  params = jax.jit(lambda x: model.init(jax.random.key(seed), x, train=False))(x)['params']
  return jax.tree.map(np.array, params)  # writable copies


def test_head_reset_pre_logits_dropped_posemb_resized():
  source = models.create_model('ViT-Ze/4', num_classes=10, representation_size=32)
  loaded = _numpy_params(source, 28)
  loaded['mask_token'] = np.ones((1, 1, 32), np.float32)  # a masked-patch-prediction leftover
  target = models.create_model('ViT-Ze/4', num_classes=3)
  values = transfer.transfer_params(loaded, _abstract(target, 36), has_cls=True,
                                    old_grid=(7, 7), new_grid=(9, 9))
  flat = npz_lib._flatten(loaded)  # pylint: disable=protected-access
  assert not any(k.startswith(('head/', 'pre_logits/', 'mask_token')) for k in values)
  assert values[POSEMB].shape == (1, 82, 32)
  np.testing.assert_array_equal(values[POSEMB][0, 0], flat[POSEMB][0, 0])
  for key, value in values.items():
    if key != POSEMB:
      np.testing.assert_array_equal(value, flat[key])
  # Kept when asked for: a fine-tune model with the same representation_size loads it.
  keep = models.create_model('ViT-Ze/4', num_classes=3, representation_size=32)
  values = transfer.transfer_params(loaded, _abstract(keep, 28), has_cls=True, old_grid=(7, 7),
                                    new_grid=(7, 7))
  np.testing.assert_array_equal(values['pre_logits/kernel'], flat['pre_logits/kernel'])


@pytest.mark.parametrize('target_options, needle', [
    (dict(representation_size=32), 'has a pre_logits layer but the checkpoint has none'),
    (dict(classifier='gap'), 'has cls, which the new model lacks'),
    (dict(hidden_size=64, num_heads=2, mlp_dim=64), 'start from a checkpoint of the same variant'),
])
def test_mismatched_checkpoints_are_one_line_errors(target_options, needle):
  loaded = _numpy_params(models.create_model('ViT-Ze/4', num_classes=10), 28)
  target = models.create_model('ViT-Ze/4', num_classes=3, **target_options)
  with pytest.raises(UserError, match=needle):
    transfer.transfer_params(loaded, _abstract(target, 28), has_cls=target.classifier != 'gap',
                             old_grid=(7, 7), new_grid=(7, 7))


def test_init_from_npz_resets_head_and_optimizer(tmp_path):
  source = models.create_model('ViT-Ze/4', num_classes=10)
  params = _numpy_params(source, 28, seed=1)
  params['head']['kernel'] += 1.0  # a trained, non-zero head
  path = str(tmp_path / 'ze.npz')
  npz_lib.save_npz(path, params)

  config = finetune.get_config('model=Ze/4,dataset=mnist5k,steps=10,image_size=36')
  config.polyak_decay = 0.5
  model = tasks.get_task(config).build_model(10)
  mesh = parallel.make_mesh(config.mesh)
  tx = optim.make_optimizer(config, optim.make_schedule(lr=0.1, total_steps=10, warmup_steps=1,
                                                        decay_type='cosine'))
  init, abstract = program.init_fn_and_shapes(model, tx, (36, 36, 1), jax.random.PRNGKey(0))
  shardings = parallel.param_shardings(abstract, mesh)
  state = jax.jit(init, out_shardings=shardings)(jax.random.PRNGKey(0))
  pretrained = transfer.read_init(path, abstract.params, model=model, image_size=36,
                                  method='bilinear')
  assert pretrained.source == path
  state = transfer.apply_init(pretrained, state, tx=tx, shardings=shardings)
  np.testing.assert_array_equal(state.params['head']['kernel'], 0.0)  # re-initialised: zeros
  np.testing.assert_array_equal(state.params['embedding']['kernel'], params['embedding']['kernel'])
  expected = posemb_resize.resize_posemb(params['Transformer']['posembed_input']['pos_embedding'],
                                    (7, 7), (9, 9), has_cls=True)
  np.testing.assert_allclose(state.params['Transformer']['posembed_input']['pos_embedding'],
                             expected, rtol=1e-6)
  # The Polyak average restarts from the transferred params, not from the random init.
  from vit_jax.train import polyak  # pylint: disable=g-import-not-at-top
  average = polyak.find_average(state.opt_state)
  np.testing.assert_array_equal(average['embedding']['kernel'], params['embedding']['kernel'])
  assert state.params['embedding']['kernel'].sharding == shardings.params['embedding']['kernel']


@pytest.mark.parametrize('init, needle', [
    ('missing', 'is neither an .npz file nor a directory'),
    ('another_model', r'ze\.npz lacks Transformer/encoderblock_2/.* of the new model'),
])
def test_a_bad_init_fails_before_anything_compiles(tmp_path, data_dir, monkeypatch, init, needle):
  """The trainer reads and checks config.init before it compiles the initial state or the train
  step (before: both were compiled first, and the process waited for the train step's compile
  before it could exit with the error)."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'missing')
  if init == 'another_model':  # a 2-block ViT-Ze/4 for the 6-block ViT-Mu/4 below
    path = str(tmp_path / 'ze.npz')
    npz_lib.save_npz(path, _numpy_params(models.create_model('ViT-Ze/4', num_classes=10), 28))

  def compiled(*args, **kwargs):
    raise AssertionError('a program was compiled before config.init was checked')

  monkeypatch.setattr(program.Program, 'compile_train_step_in_background', compiled)
  monkeypatch.setattr(program.Program, 'init_state', compiled)
  config = mnist5k.get_config('model_name=ViT-Mu/4,steps=6,batch_size=16')
  config.data_dir, config.warmup_steps, config.init = data_dir, 1, path
  with pytest.raises(UserError, match=needle):
    loop.train_and_evaluate(config, str(tmp_path / 'work'))


def test_bad_init_paths(tmp_path):
  with pytest.raises(UserError, match='neither an .npz file nor a directory'):
    transfer.load_pretrained(str(tmp_path / 'nothing'))
  with pytest.raises(UserError, match='no checkpoints in'):
    transfer.load_pretrained(str(tmp_path))


def test_trained_grid_comes_from_the_stored_config():
  # (the stored config drives the old grid of a workdir init)
  config = ml_collections.ConfigDict({'model_name': 'ViT-Ze/4', 'image_size': 36})
  assert transfer._trained_grid(config) == (9, 9)  # pylint: disable=protected-access
  unknown = ml_collections.ConfigDict({'model_name': 'x'})
  assert transfer._trained_grid(unknown) is None  # pylint: disable=protected-access


def test_an_rgb_checkpoint_for_a_one_channel_run_names_the_channels():
  rgb = models.create_model('ViT-Ze/4', num_classes=10)
  loaded = jax.tree.map(np.asarray, jax.jit(lambda x: rgb.init(jax.random.key(0), x,
                                                               train=False))(
      np.zeros((1, 28, 28, 3), np.float32))['params'])
  target = models.create_model('ViT-Ze/4', num_classes=3)
  with pytest.raises(UserError, match=r'^config.init=x.npz was trained on 3-channel images and '
                                      r'this run feeds 1-channel ones: end config.pp.train and '
                                      r'config.pp.eval with channels\(3\) '
                                      r'\(images are converted: .*\), or start from a checkpoint '
                                      r'trained on 1-channel images$'):
    transfer.transfer_params(loaded, _abstract(target, 28, channels=1), has_cls=True,
                             old_grid=(7, 7), new_grid=(7, 7), what='config.init=x.npz')
  values = transfer.transfer_params(loaded, _abstract(target, 28, channels=3), has_cls=True,
                                    old_grid=(7, 7), new_grid=(7, 7))
  np.testing.assert_array_equal(values['embedding/kernel'], loaded['embedding']['kernel'])


@pytest.mark.slow
def test_a_refused_init_leaves_no_workdir_and_no_checkpoints_folder(tmp_path, data_dir):
  """The init is read once the run has created its workdir (a resume ignores it): refused, the
  run removes the folders it created and leaves an existing workdir as it was."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  rgb = tmp_path / 'rgb.npz'
  npz_lib.save_npz(str(rgb), _numpy_params(models.create_model('ViT-Ze/4', num_classes=10), 28,
                                           channels=3))
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=6,batch_size=16')
  config.data_dir, config.warmup_steps, config.init = data_dir, 1, str(rgb)
  with pytest.raises(UserError, match='was trained on 3-channel images'):
    loop.train_and_evaluate(config, str(tmp_path / 'new'))
  assert not (tmp_path / 'new').exists()
  existing = tmp_path / 'existing'
  existing.mkdir()
  (existing / 'notes.txt').write_text('keep me')
  with pytest.raises(UserError, match='was trained on 3-channel images'):
    loop.train_and_evaluate(config, str(existing))
  assert sorted(p.name for p in existing.iterdir()) == ['notes.txt']
