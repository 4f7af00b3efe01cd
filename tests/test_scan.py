"""The scanned encoder (`model.scan`): the unrolled model's init stacked, the same logits and
gradients, and the one pair of layout conversions (vit_jax/models/layout.py) between them."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.configs import common
from vit_jax.configs import mnist5k
from vit_jax import analysis
from vit_jax.serving import inference
from vit_jax.serving import bundle as bundle_lib
from vit_jax.formats import npz as npz_lib
from vit_jax.checkpoint import restore
from vit_jax.formats import timm_layout
from vit_jax.checkpoint import train_ckpt
from vit_jax.train import transfer
from vit_jax.models.spec import ModelSpec
from vit_jax.errors import UserError
from vit_jax.models import create_model
from vit_jax.models import layout
from vit_jax.models import vit as vit_lib
from vit_jax.parallel import mesh as mesh_lib
from vit_jax.train import loop
from vit_jax.tasks import losses
from vit_jax.train import program, step as step_lib

# One worker runs this module, so its shared fixtures are computed once per test run.
pytestmark = pytest.mark.xdist_group('scan')

X = np.random.default_rng(0).uniform(-1, 1, (3, 28, 28, 1)).astype(np.float32)
LABELS = np.array([0, 3, 7])
# Tiny models with 3 blocks (layer rates 0, 1/2, 1 of the stochastic depth), ViT and hybrid.
NAMES = ('ViT-Ze/4', 'R+ViT-Ze/4')


def _pair(name, **options):
  """(unrolled, scanned) models with the same options."""
  options = {'num_layers': 3, **options}
  return (create_model(name, num_classes=10, **options),
          create_model(name, num_classes=10, scan=True, **options))


def _init(model, seed=0):
  return jax.jit(lambda k: model.init(k, X[:1], train=False))(jax.random.key(seed))['params']


def _perturbed(params, seed=1):
  """Params with a non-zero head, so that every gradient is non-trivial."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [p + 0.05 * jax.random.normal(k, p.shape, p.dtype)
                                      for p, k in zip(leaves, keys)])


def _rel(got, want):
  return float(np.max(np.abs(np.asarray(got) - np.asarray(want))) /
               max(float(np.max(np.abs(np.asarray(want)))), 1e-30))


def _assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('name, options', [
    ('R+ViT-Ze/4', {}),
    ('ViT-Ze/4', {'with_mask_token': True, 'representation_size': 16, 'dtype': 'bfloat16'})])
@pytest.mark.slow
def test_scanned_init_is_the_unrolled_init_stacked(name, options):
  unrolled, scanned = _pair(name, **options)
  plain, stacked = _init(unrolled), _init(scanned)
  blocks = stacked['Transformer']
  assert 'encoderblock' in blocks and not any(k.startswith('encoderblock_') for k in blocks)
  assert blocks['encoderblock']['MlpBlock_0']['Dense_0']['kernel'].shape == (3, 32, 64)
  _assert_trees_equal(stacked, layout.stack_blocks(plain))  # bitwise
  # eval_shape (how the trainer gets its shapes and shardings) sees the same tree.
  abstract = jax.eval_shape(lambda: scanned.init(jax.random.key(0), X[:1], train=False))
  assert jax.tree.map(jnp.shape, abstract['params']) == jax.tree.map(jnp.shape, stacked)


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.parametrize('remat', ['none', 'full', 'dots'])
@pytest.mark.slow
def test_scanned_logits_and_gradients_equal_unrolled(name, remat):
  """fp32, rel 1e-6; and the scanned program really is one scanned layer."""
  unrolled, scanned = _pair(name, remat=remat)
  params = _perturbed(_init(unrolled))

  def loss_and_logits(model, p):
    logits = model.apply({'params': p}, X, train=False)
    return jnp.mean(losses.softmax_xent(logits, jax.nn.one_hot(LABELS, 10))), logits

  def run(model, p):
    fn = jax.value_and_grad(lambda p: loss_and_logits(model, p), has_aux=True)
    return jax.jit(fn)(p), jax.make_jaxpr(fn)(p)

  ((_, logits), grads), unrolled_jaxpr = run(unrolled, params)
  ((_, scan_logits), scan_grads), scan_jaxpr = run(scanned, layout.stack_blocks(params))
  assert _rel(scan_logits, logits) < 1e-6
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads))
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(scan_grads),
                               jax.tree.leaves(layout.stack_blocks(grads))):
    name = jax.tree_util.keystr(path)
    if "['key']['bias']" in name:  # softmax ignores it: zero up to rounding, in both models
      assert np.abs(got).max() < 1e-6 * scale and np.abs(want).max() < 1e-6 * scale
    else:
      assert _rel(got, want) < 1e-6, (name, _rel(got, want))
  assert 'scan[' in str(scan_jaxpr) and 'scan[' not in str(unrolled_jaxpr)
  count = lambda jaxpr: str(jaxpr).count('dot_general')
  assert count(scan_jaxpr) < count(unrolled_jaxpr)  # one block traced, not three
  if remat != 'none':
    assert 'remat' in str(scan_jaxpr) or 'checkpoint' in str(scan_jaxpr)


@pytest.mark.slow
def test_a_scanned_backward_pass_needs_no_more_memory_than_unrolled():
  """XLA:CPU temporaries of the gradient (ViT-Mu/4, batch 8, remat none). XLA cannot fuse across
  a scan's iterations, so without `SCAN_NO_REMAT_POLICY` the scanned pass stored every
  elementwise intermediate (28.6 MB here against 19.3 MB unrolled)."""
  x = jnp.ones((8, 28, 28, 1))
  temp = {}
  for scan in (False, True):
    model = create_model('ViT-Mu/4', num_classes=10, scan=scan)
    params = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), x, train=False)['params'])
    grad = jax.jit(jax.grad(lambda p, m=model: m.apply({'params': p}, x, train=False).sum()))
    temp[scan] = grad.lower(params).compile().memory_analysis().temp_size_in_bytes
  assert temp[True] <= temp[False], temp


def test_drop_path_takes_a_traced_rate():
  x = jnp.ones((500, 3))
  key = jax.random.key(2)
  traced = jax.jit(vit_lib.drop_path)
  np.testing.assert_array_equal(traced(x, 1.0, key), 0.)  # rate 1 drops every example
  np.testing.assert_array_equal(traced(x, 0.0, key), x)
  np.testing.assert_array_equal(traced(x, 0.25, key), vit_lib.drop_path(x, 0.25, key))
  assert 0.2 < float((traced(x, 0.25, key)[:, 0] == 0).mean()) < 0.3


@pytest.mark.slow
def test_scanned_stochastic_depth_and_dropout():
  """Per-layer drop-path rates are scanned inputs: with stochastic_depth=1 over 2 layers, block 1
  is always dropped and block 0 never (so the output is the 1-block model's); dropout draws are
  reproducible per rng and differ between rngs."""
  two = create_model('ViT-Ze/4', num_classes=10, scan=True, stochastic_depth=1.0)
  one = create_model('ViT-Ze/4', num_classes=10, num_layers=1)
  params = _perturbed(_init(create_model('ViT-Ze/4', num_classes=10)))
  params_one = jax.tree.map(lambda p: p, params)
  del params_one['Transformer']['encoderblock_1']
  expected = one.apply({'params': params_one}, X, train=False)
  stacked = layout.stack_blocks(params)
  for seed in (0, 1):
    got = two.apply({'params': stacked}, X, train=True, rngs={'dropout': jax.random.key(seed)})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
  assert not np.allclose(two.apply({'params': stacked}, X, train=False), expected)

  _, scanned = _pair('ViT-Ze/4', dropout_rate=0.2, stochastic_depth=0.5)
  stacked = layout.stack_blocks(_perturbed(_init(scanned.clone(scan=False))))
  run = jax.jit(lambda seed: scanned.apply({'params': stacked}, X, train=True,
                                           rngs={'dropout': jax.random.key(seed)}))
  evaluated = scanned.apply({'params': stacked}, X, train=False)
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.allclose(run(0), run(1)) and not np.allclose(run(0), evaluated)


@pytest.mark.slow
def test_scanned_bfloat16_and_mask_token():
  """bf16 compute through the scan carry; MPP's corrupted patches go through the same way."""
  unrolled, scanned = _pair('ViT-Ze/4', dtype='bfloat16', with_mask_token=True)
  params = _perturbed(_init(unrolled))
  corrupt = {'source': jnp.tile(jnp.arange(49)[::-1], (3, 1)),
             'use_mask': jnp.arange(49)[None, :] % 3 == jnp.arange(3)[:, None]}
  want = unrolled.apply({'params': params}, X, train=False, corrupt=corrupt)
  got, state = scanned.apply({'params': layout.stack_blocks(params)}, X, train=False,
                             corrupt=corrupt, mutable=['intermediates'])
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=0.02, atol=0.02 * float(np.abs(want).max()))
  weights = state['intermediates']['Transformer']['encoderblock'][
      'MultiHeadDotProductAttention_0']['attention_weights'][0]
  assert weights.shape == (3, 3, 2, 50, 50) and weights.dtype == jnp.bfloat16  # [L, B, H, N, N]
  no_mask = unrolled.apply({'params': params}, X, train=False)
  assert not np.allclose(want, no_mask)


@pytest.mark.slow
def test_attention_of_a_scanned_model_comes_out_per_layer():
  unrolled, scanned = _pair('R+ViT-Ze/4')
  params = _perturbed(_init(unrolled))
  want_logits, want = analysis.forward_with_attention(unrolled, params, X, batch_size=2)
  for given in (params, layout.stack_blocks(params)):  # either layout
    logits, attn = analysis.forward_with_attention(scanned, given, X, batch_size=2)
    assert attn.shape == want.shape == (3, 3, 2, 50, 50)
    np.testing.assert_allclose(attn, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-6, atol=1e-7)


def test_bit_keeps_accepting_the_neutral_scan():
  assert create_model('BiT-R14x0.5', num_classes=10, scan=False) is not None
  with pytest.raises(UserError, match='model.scan=True does not apply to BiT-R14x0.5'):
    create_model('BiT-R14x0.5', num_classes=10, scan=True)


# ---------------------------------------------------------------------------------------------
# layout: the one pair of conversions.


def test_layout_converts_a_whole_train_state_and_back():
  """Params, Adam's mu and nu, the weight-decay mask's state and a Polyak average; numpy leaves
  stay numpy; a tree already in the target layout is unchanged."""
  from vit_jax.train import polyak  # pylint: disable=g-import-not-at-top
  params = _init(_pair('ViT-Ze/4')[0])
  tx = optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(
                       0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
                   polyak.ema_of_params(0.5))
  state = step_lib.TrainState.create(params, tx)
  stacked = layout.stack_blocks(state)
  assert layout.is_stacked(stacked) and not layout.is_stacked(state)
  mu = stacked.opt_state[0].mu['Transformer']['encoderblock']['LayerNorm_0']['scale']
  assert mu.shape == (3, 32)
  assert polyak.find_average(stacked.opt_state)['Transformer']['encoderblock'][
      'MlpBlock_0']['Dense_1']['kernel'].shape == (3, 64, 32)
  _assert_trees_equal(layout.unstack_blocks(stacked), state)
  _assert_trees_equal(layout.stack_blocks(stacked), stacked)
  _assert_trees_equal(layout.unstack_blocks(state), state)
  as_numpy = layout.stack_blocks(jax.tree.map(np.asarray, params))
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(as_numpy))
  assert list(layout.unstack_blocks(as_numpy)['Transformer']) == list(params['Transformer'])


def test_layout_of_shapes_moves_the_sharding_by_one_axis():
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=2, model=2)))
  sds = jax.ShapeDtypeStruct((32, 2, 16), jnp.float32,
                             sharding=NamedSharding(mesh, P('fsdp', 'model')))
  tree = {'Transformer': {'encoderblock_0': {'k': sds}, 'encoderblock_1': {'k': sds}}}
  stacked = layout.stack_blocks(tree)['Transformer']['encoderblock']['k']
  assert stacked.shape == (2, 32, 2, 16) and stacked.sharding.spec == P(None, 'fsdp', 'model')
  back = layout.unstack_blocks({'encoderblock': {'k': stacked}})['encoderblock_1']['k']
  assert back.shape == (32, 2, 16) and back.sharding.spec == P('fsdp', 'model')


def test_layout_refuses_mixed_or_gapped_trees():
  leaf = np.zeros(2)
  with pytest.raises(ValueError, match='not numbered 0..1'):
    layout.stack_blocks({'encoderblock_0': leaf, 'encoderblock_2': leaf})
  with pytest.raises(ValueError, match='both encoderblock and encoderblock_i'):
    layout.stack_blocks({'encoderblock': leaf, 'encoderblock_0': leaf})
  with pytest.raises(ValueError, match='layer axes of sizes'):
    layout.unstack_blocks({'encoderblock': {'a': np.zeros((2, 3)), 'b': np.zeros((3, 3))}})


# ---------------------------------------------------------------------------------------------
# Boundaries: training checkpoints, config.init, .npz, timm, bundles and predict.


def _run_config(data_dir, scan, **overrides):
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=6,batch_size=32,lr=0.01')
  config.warmup_steps, config.log_every, config.eval_every, config.checkpoint_every = 2, 1, 6, 3
  config.progress, config.data_dir, config.model.scan = False, data_dir, scan
  common.apply(config, overrides)
  return config


def _losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['loss'] for r in map(json.loads, f) if r['split'] == 'train']


@pytest.fixture(scope='module')
def runs(tmp_path_factory, data_dir):
  """Two 6-step runs of ViT-Ze/4 (checkpoints at steps 3 and 6), unrolled and scanned."""
  base = tmp_path_factory.mktemp('scan_runs')
  out = {}
  for scan in (False, True):
    out[scan] = str(base / ('scanned' if scan else 'unrolled'))
    loop.train_and_evaluate(_run_config(data_dir, scan), out[scan])
  return out


def _stored_tree(workdir, step):
  return train_ckpt.Checkpointer(workdir, keep=3).stored_tree(step)


@pytest.mark.slow
def test_a_scanned_run_trains_like_unrolled_and_checkpoints_stacked(runs):
  np.testing.assert_allclose(_losses(runs[True]), _losses(runs[False]), rtol=1e-5)
  assert len(_losses(runs[True])) == 6
  assert layout.is_stacked(_stored_tree(runs[True], 6))
  assert not layout.is_stacked(_stored_tree(runs[False], 6))


@pytest.mark.parametrize('scan_before', [False, True])
@pytest.mark.slow
def test_a_run_resumes_across_a_scan_change(runs, tmp_path, data_dir, scan_before, capsys):
  """Steps 4-6 after a restart with the other `model.scan` (not refused as config drift; the
  scanned side on an FSDP mesh) give the uninterrupted run's losses, optimizer state included."""
  resumed = tmp_path / 'resumed'
  shutil.copytree(runs[scan_before], resumed)
  shutil.rmtree(resumed / 'checkpoints' / '6')  # as if the run had stopped after step 3
  mesh = {'mesh.data': 2, 'mesh.fsdp': 4} if not scan_before else {}
  capsys.readouterr()
  loop.train_and_evaluate(_run_config(data_dir, not scan_before, **mesh), str(resumed))
  assert 'at step 3' in capsys.readouterr().err  # resumed, nothing set aside
  assert not (resumed / 'corrupt_checkpoints').exists()
  losses = _losses(resumed)
  assert len(losses) == 6
  np.testing.assert_allclose(losses, _losses(runs[scan_before]), rtol=1e-5)
  assert layout.is_stacked(_stored_tree(str(resumed), 6)) == (not scan_before)


def _program(data_dir, scan, **overrides):
  return program.build_program(_run_config(data_dir, scan, **overrides))


def _restored(workdir, prog, step=3):
  abstract = train_ckpt.abstract_with_shardings(prog.abstract_state, prog.state_shardings)
  state, _ = train_ckpt.Checkpointer(workdir, keep=3).restore(step, abstract)
  return state


@pytest.mark.slow
def test_checkpointer_converts_either_layout_exactly(runs, data_dir):
  """The whole train state (params, Adam's mu and nu, counters) restored into the other layout
  is the stored state converted, bit for bit, in the restoring run's shardings."""
  progs = {scan: _program(data_dir, scan, **{'mesh.data': 4, 'mesh.model': 2})
           for scan in (False, True)}
  for stored in (False, True):
    same = _restored(runs[stored], progs[stored])
    other = _restored(runs[stored], progs[not stored])
    _assert_trees_equal(jax.device_get(other),
                        jax.device_get(layout.to_layout(same, not stored)))
    for leaf, sharding_ in zip(jax.tree.leaves(other),
                               jax.tree.leaves(progs[not stored].state_shardings)):
      assert leaf.sharding == sharding_


def test_load_checkpoint_of_a_scanned_run_has_the_official_names(runs, data_dir):
  params, config = restore.load_checkpoint(restore.resolve_checkpoint(runs[True]))
  assert config.model.scan and 'encoderblock_1' in params['Transformer']
  state = _restored(runs[True], _program(data_dir, True), step=6)
  _assert_trees_equal(params, jax.device_get(layout.unstack_blocks(state.params)))


def test_analyses_and_fewshot_load_a_scanned_run_as_its_scanned_model(runs):
  """`inputs.load_model` (the analyses' report and the few-shot CLI): the run's scanned model with
  its blocks stacked, computing what the unrolled model computes on the official params."""
  step_dir = restore.resolve_checkpoint(runs[True])
  model, params, config = analysis.inputs.load_model(step_dir)
  assert config.model.scan and model.scan and layout.is_stacked(params)
  official, _ = restore.load_checkpoint(step_dir)
  logits = model.apply({'params': params}, X, train=False)
  assert _rel(logits, model.clone(scan=False).apply({'params': official}, X, train=False)) < 1e-6


@pytest.mark.parametrize('source, scan', [('unrolled', True), ('npz', True), ('scanned', False)])
def test_config_init_transfers_across_layouts(runs, data_dir, tmp_path, source, scan):
  """A scanned run initialised from an unrolled workdir or .npz, an unrolled run from a scanned
  workdir: every parameter but the fresh head is the source's, in the new run's layout."""
  workdir = runs[source == 'scanned']
  params, _ = restore.load_checkpoint(restore.resolve_checkpoint(workdir))
  init = workdir
  if source == 'npz':
    init = str(tmp_path / 'source.npz')
    npz_lib.save_npz(init, params)
  prog = _program(data_dir, scan, init=init)
  pretrained = transfer.read_init(init, prog.abstract_state.params, model=prog.model,
                                  image_size=28, method='bilinear')
  state = transfer.apply_init(pretrained, prog.init_state(), tx=prog.tx,
                              shardings=prog.state_shardings)
  got = jax.device_get(state.params)
  np.testing.assert_array_equal(got['head']['kernel'], 0.)
  del got['head'], params['head']
  _assert_trees_equal(got, layout.to_layout(params, scan))


@pytest.mark.slow
def test_npz_and_timm_files_of_a_scanned_model_are_the_unrolled_files(tmp_path):
  unrolled, scanned = _pair('R+ViT-Ze/4')
  params = jax.device_get(_perturbed(_init(unrolled)))
  stacked = layout.stack_blocks(params)
  npz_lib.save_npz(tmp_path / 'unrolled.npz', params)
  npz_lib.save_npz(tmp_path / 'scanned.npz', stacked)
  want, got = (npz_lib.read_npz_arrays(tmp_path / f'{n}.npz') for n in ('unrolled', 'scanned'))
  assert sorted(got) == sorted(want) and 'Transformer/encoderblock_2/LayerNorm_2/scale' in got
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value)
  loaded = npz_lib.load_for_model(tmp_path / 'scanned.npz', scanned, (28, 28, 1))
  _assert_trees_equal(loaded, stacked)
  assert _rel(scanned.apply({'params': loaded}, X, train=False),
              unrolled.apply({'params': params}, X, train=False)) < 1e-6

  spec = ModelSpec('R+ViT-Ze/4', 10, {'num_layers': 3, 'scan': True}, 28, 1)
  state_dict = timm_layout.save_safetensors(tmp_path / 'scanned.safetensors', stacked, spec=spec)
  want = timm_layout.to_timm(params)
  assert sorted(state_dict) == sorted(want) and 'blocks.2.attn.qkv.weight' in want
  for key, value in want.items():
    np.testing.assert_array_equal(state_dict[key], value)
  back, stored = timm_layout.load_safetensors(tmp_path / 'scanned.safetensors')
  assert stored.options == {'num_layers': 3}  # the file knows nothing of the scan
  _assert_trees_equal(back, jax.tree.map(np.float32, params))


def test_bundle_and_predict_of_a_scanned_run(runs, tmp_path):
  """A scanned run predicts through its scanned model; its bundle holds the unrolled files and
  predicts the same probabilities through the unrolled model."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  paths = []
  for i in range(3):
    paths.append(str(tmp_path / f'{i}.png'))
    Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)).save(paths[-1])
  live = bundle_lib.from_workdir(runs[True])
  assert live.spec.options['scan'] and layout.is_stacked(live.params)
  bundle_lib.save(live, str(tmp_path / 'bundle'))
  with open(tmp_path / 'bundle' / 'model.json') as f:
    assert 'scan' not in json.load(f)['options']
  bundle_lib.save(bundle_lib.from_workdir(runs[False]), str(tmp_path / 'unrolled_bundle'))
  keys = lambda d: sorted(npz_lib.read_npz_arrays(tmp_path / d / 'params.npz'))
  assert keys('bundle') == keys('unrolled_bundle')
  saved = bundle_lib.load(str(tmp_path / 'bundle'))
  assert not saved.spec.build().scan and not layout.is_stacked(saved.params)
  probabilities = lambda b: np.array([[t['probability'] for t in r['top']]
                                      for r in inference.predict(b, paths, top_k=10)])
  np.testing.assert_allclose(probabilities(live), probabilities(saved), rtol=1e-5, atol=1e-7)
