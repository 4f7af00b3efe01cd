"""Scale-out on 8 simulated CPU devices: mesh, sharding policy, both parallel paths, memory controls."""

import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax.configs import common
from vit_jax.configs import mnist5k
from vit_jax import models
from vit_jax.tools.benchmarking import ours
from vit_jax.errors import UserError
from vit_jax.parallel import mesh as mesh_lib
from vit_jax.parallel import sharding
from vit_jax.train import loop
from vit_jax.train import program
from vit_jax.tasks import losses
from helpers import train_losses


def _mesh_config(data=-1, fsdp=1, model=1):
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, model=model))


def test_mesh_shape_resolves_minus_one_and_rejects_bad_sizes():
  assert mesh_lib.mesh_shape(_mesh_config(), 8) == (8, 1, 1)
  assert mesh_lib.mesh_shape(_mesh_config(data=2, fsdp=-1), 8) == (2, 4, 1)
  assert mesh_lib.mesh_shape(_mesh_config(data=-1, model=2), 8) == (4, 1, 2)
  assert mesh_lib.mesh_shape(_mesh_config(data=1, fsdp=2, model=4), 8) == (1, 2, 4)
  for bad, needle in [(dict(data=-1, fsdp=-1), 'at most one axis'),
                      (dict(data=3), 'has 3 devices but there are 8'),
                      (dict(data=-1, model=3), '3 does not divide the 8 devices'),
                      (dict(data=0), 'must be positive')]:
    with pytest.raises(UserError, match=needle):
      mesh_lib.mesh_shape(_mesh_config(**bad), 8)
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=2, model=2))
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 2, 'model': 2}
  assert mesh_lib.make_mesh(_mesh_config(), jax.devices()[:1]).devices.size == 1


def _abstract_state(name, num_classes=1000, size=224, **options):
  """The trainer's own TrainState shapes for `name` with Adam."""
  model = models.create_model(name, num_classes=num_classes, **options)
  _, abstract = program.init_fn_and_shapes(model, optax.adam(1e-3), (size, size, 3),
                                           jax.random.PRNGKey(0))
  return abstract


def _spec(shardings, *path):
  node = shardings
  for key in path:
    node = node[key] if isinstance(node, dict) else getattr(node, key)
  return node.spec


@pytest.mark.slow
def test_tensor_parallel_rules_split_heads_and_mlp_units():
  state = _abstract_state('ViT-B/16')
  mesh = mesh_lib.make_mesh(_mesh_config(data=-1, model=2))
  sh = sharding.param_shardings(state, mesh)
  block = ('params', 'Transformer', 'encoderblock_3')
  attn = block + ('MultiHeadDotProductAttention_0',)
  assert _spec(sh, *attn, 'query', 'kernel') == P(None, 'model', None)   # [D, heads, hd]
  assert _spec(sh, *attn, 'value', 'bias') == P('model', None)           # [heads, hd]
  assert _spec(sh, *attn, 'out', 'kernel') == P('model', None, None)     # [heads, hd, D]
  assert _spec(sh, *attn, 'out', 'bias') == P(None)
  assert _spec(sh, *block, 'MlpBlock_0', 'Dense_0', 'kernel') == P(None, 'model')
  assert _spec(sh, *block, 'MlpBlock_0', 'Dense_0', 'bias') == P('model')
  assert _spec(sh, *block, 'MlpBlock_0', 'Dense_1', 'kernel') == P('model', None)
  assert _spec(sh, *block, 'LayerNorm_0', 'scale') == P(None)
  assert _spec(sh, 'params', 'embedding', 'kernel') == P(None, None, None, None)
  # Adam's moments follow their parameter; the step count is replicated.
  mu = sh.opt_state[0].mu
  assert mu['Transformer']['encoderblock_3']['MultiHeadDotProductAttention_0']['key'][
      'kernel'].spec == P(None, 'model', None)
  assert sh.opt_state[0].count.spec == P()
  # Ti has 3 heads: the model axis (2) cannot split them, so they stay whole.
  ti = sharding.param_shardings(_abstract_state('ViT-Ti/16'), mesh)
  assert _spec(ti, *attn, 'query', 'kernel') == P(None, None, None)
  assert _spec(ti, *block, 'MlpBlock_0', 'Dense_0', 'kernel') == P(None, 'model')


def test_fsdp_splits_big_leaves_on_their_largest_divisible_axis():
  state = _abstract_state('ViT-B/16')
  mesh = mesh_lib.make_mesh(_mesh_config(data=1, fsdp=-1))
  sh = sharding.param_shardings(state, mesh)
  block = ('params', 'Transformer', 'encoderblock_0')
  assert _spec(sh, *block, 'MlpBlock_0', 'Dense_0', 'kernel') == P(None, 'fsdp')  # [768, 3072]
  assert _spec(sh, *block, 'MlpBlock_0', 'Dense_1', 'kernel') == P('fsdp', None)  # [3072, 768]
  attn = block + ('MultiHeadDotProductAttention_0',)
  assert _spec(sh, *attn, 'query', 'kernel') == P('fsdp', None, None)       # [768, 12, 64]
  assert _spec(sh, 'params', 'embedding', 'kernel') == P(None, None, None, 'fsdp')
  assert _spec(sh, *block, 'LayerNorm_0', 'scale') == P(None)              # 768 < FSDP_MIN_SIZE
  assert _spec(sh, 'params', 'head', 'kernel') == P(None, 'fsdp')           # [768, 1000]
  # Per device: one eighth of the big leaves, all of the small ones.
  replicated_bytes = sharding.state_bytes_per_device(
      state, sharding.param_shardings(state, mesh_lib.make_mesh(_mesh_config())))
  fsdp_bytes = sharding.state_bytes_per_device(state, sh)
  # Three int32 counters (step, skipped steps, Adam's count) + params + Adam's mu and nu.
  assert replicated_bytes == 4 * (3 + 3 * 86_567_656)
  small = sum(4 * x.size for x in jax.tree.leaves(state) if x.size < sharding.FSDP_MIN_SIZE)
  assert 0 < small < replicated_bytes / 500
  assert fsdp_bytes == (replicated_bytes - small) // 8 + small  # every big leaf has a dim of 768
  # Both together: tensor-parallel axis first, fsdp on the largest remaining one.
  both = sharding.param_shardings(state, mesh_lib.make_mesh(_mesh_config(data=1, fsdp=4,
                                                                         model=2)))
  assert _spec(both, *attn, 'query', 'kernel') == P('fsdp', 'model', None)
  assert _spec(both, *block, 'MlpBlock_0', 'Dense_1', 'kernel') == P('model', 'fsdp')


def test_stacked_blocks_take_one_blocks_rules_and_keep_the_layer_axis_whole():
  """A scanned encoder's [L, ...] params and Adam moments on data x fsdp x model: every stacked
  leaf is sharded as one unrolled block's leaf, with the layer axis unsharded."""
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=2, model=2))
  stacked = sharding.param_shardings(_abstract_state('ViT-B/16', scan=True), mesh)
  unrolled = sharding.param_shardings(_abstract_state('ViT-B/16'), mesh)
  attn = ('params', 'Transformer', 'encoderblock', 'MultiHeadDotProductAttention_0')
  assert _spec(stacked, *attn, 'query', 'kernel') == P(None, 'fsdp', 'model', None)
  assert _spec(stacked, *attn[:-1], 'MlpBlock_0', 'Dense_1', 'kernel') == P(None, 'model',
                                                                            'fsdp')
  pad = lambda spec, n: tuple(spec) + (None,) * (n - len(spec))
  block0 = {jax.tree_util.keystr(k).replace("['encoderblock_0']", "['encoderblock']"): v
            for k, v in jax.tree_util.tree_leaves_with_path(unrolled)
            if "['encoderblock_0']" in jax.tree_util.keystr(k)}
  checked = 0
  for path, spec in jax.tree_util.tree_leaves_with_path(stacked):
    name = jax.tree_util.keystr(path)
    if "['encoderblock']" in name:  # params, mu and nu
      ndim = len(block0[name].spec) + 1
      assert pad(spec.spec, ndim) == (None,) + pad(block0[name].spec, ndim - 1), name
      checked += 1
  assert checked == 3 * 16
  # The layer axis stays whole even where it is the only axis 'fsdp' divides.
  assert sharding.param_spec('params/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel',
                             (8, 4097, 3), mesh) == P(None, None, None)
  assert sharding.param_spec('opt_state/0/mu/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel',
                             (8, 4096, 6), mesh) == P(None, 'fsdp', 'model')


def test_activation_rules():
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=2, model=2))
  assert sharding.activation_spec(('batch', 'tokens', 'embed'), (8, 50, 32), mesh) == P(
      ('data', 'fsdp'), None, None)
  assert sharding.activation_spec(('batch', 'tokens', 'heads', 'kv'), (8, 50, 4, 8), mesh) == P(
      ('data', 'fsdp'), None, 'model', None)
  # Sizes the mesh axes do not divide stay unconstrained.
  assert sharding.activation_spec(('batch', 'tokens', 'mlp'), (6, 50, 33), mesh) == P(
      None, None, None)
  # Axes of size 1 are dropped.
  dp = mesh_lib.make_mesh(_mesh_config())
  assert sharding.activation_spec(('batch', 'tokens', 'mlp'), (8, 50, 64), dp) == P(
      'data', None, None)
  x = jnp.ones((8, 3))
  assert sharding.constrain(x, ('batch', 'embed')) is x  # no-op outside activation_sharding


def _config(**overrides):
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=10,batch_size=32,lr=0.01')
  c.warmup_steps, c.log_every, c.eval_every, c.checkpoint_every = 2, 1, 10, 10
  c.progress = False
  common.apply(c, overrides)
  return c


STRATEGIES = {
    'jit data parallel': {},
    'jit fsdp': {'mesh.data': 1, 'mesh.fsdp': -1},
    'jit data x model': {'mesh.data': -1, 'mesh.model': 2},
    'pmap': {'parallelism': 'pmap'},
}


@pytest.mark.slow
def test_every_strategy_trains_like_one_device(tmp_path, data_dir):
  """10 steps from the same init and data: every strategy, with the scanned encoder
  (model.scan), gives the 1-device losses of the unrolled encoder (fp32); the unrolled encoder
  under pmap too (the other strategies run it unrolled in the tests around this one)."""
  reference = _train_losses_of(tmp_path / 'one', data_dir, {}, jax.devices()[:1])
  assert len(reference) == 10 and max(reference) - min(reference) > 0.05, reference
  runs = {f'{name} scanned': {**overrides, 'model.scan': True}
          for name, overrides in STRATEGIES.items()}
  runs['pmap unrolled'] = STRATEGIES['pmap']
  for name, overrides in runs.items():
    got = _train_losses_of(tmp_path / name.replace(' ', '_'), data_dir, overrides, None)
    np.testing.assert_allclose(got, reference, rtol=1e-5, err_msg=name)


def _train_losses_of(workdir, data_dir, overrides, devices):
  loop.train_and_evaluate(_config(data_dir=data_dir, **overrides), str(workdir), devices=devices)
  return train_losses(workdir)


@pytest.mark.slow
def test_restore_under_another_mesh_continues_the_run(tmp_path, data_dir):
  """A data-parallel checkpoint resumes under FSDP x tensor parallelism with the same losses."""
  straight = tmp_path / 'straight'
  loop.train_and_evaluate(_config(data_dir=data_dir, total_steps=6, checkpoint_every=3),
                          str(straight))
  resumed = tmp_path / 'resumed'
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / 'checkpoints' / '6')  # as if the run had stopped after step 3
  loop.train_and_evaluate(_config(data_dir=data_dir, total_steps=6, checkpoint_every=3, **{
      'mesh.data': 1, 'mesh.fsdp': 4, 'mesh.model': 2}), str(resumed))
  losses = train_losses(resumed)  # steps 1-3 kept from the log, 4-6 trained under the new mesh
  assert len(losses) == 6
  np.testing.assert_allclose(losses, train_losses(straight), rtol=1e-5)


def test_parallel_config_errors(tmp_path, data_dir):
  cases = [
      ({'parallelism': 'pmap', 'mesh.data': -1, 'mesh.fsdp': 2}, 'pmap is data parallel only'),
      ({'parallelism': 'xmap'}, "unknown parallelism 'xmap'"),
      ({'mesh.data': -1, 'mesh.model': 4}, 'mesh.model=4 does not divide the 2 attention heads'),
      ({'batch_size': 9, 'mesh.data': 2, 'mesh.model': 4},
       'does not split over 2 batch shards'),
      ({'data_sharding': 'host'}, "unknown data_sharding 'host'"),
      ({'model.remat': 'some'}, "unknown remat 'some'"),
  ]
  for overrides, needle in cases:
    with pytest.raises(UserError, match=needle):
      loop.train_and_evaluate(_config(data_dir=data_dir, **overrides), str(tmp_path / 'w'))
  assert not (tmp_path / 'w' / 'checkpoints').exists()


@pytest.mark.slow
def test_compile_only_reports_memory_without_training(tmp_path, capsys):
  """FSDP stores 1/8 of the state per device; no dataset, workdir or params are needed. ViT-Ti/16
  with 2 of its 12 layers: the same kernels (FSDP splits those of 4,096 values or more), compiled
  in a fraction of the time (test_models checks the whole model's count)."""
  common = dict(dataset='imagenet2012', data_dir=str(tmp_path / 'no_data'), num_classes=1000,
                image_size=224, batch_size=8, compile_only=True, total_steps=100,
                **{'pp.train': 'resize|channels(3)', 'pp.eval': 'resize|channels(3)',
                   'model.num_layers': 2})
  common['model_name'] = 'ViT-Ti/16'
  reports = {}
  for name, overrides in [('dp', {}), ('fsdp', {'mesh.data': 1, 'mesh.fsdp': -1})]:
    reports[name] = loop.train_and_evaluate(_config(**common, **overrides),
                                            str(tmp_path / 'work'))
  out = capsys.readouterr().out
  assert 'compile-only: ViT-Ti/16 at 224 px, batch 8, jit, mesh data 1 x fsdp 8' in out
  assert not (tmp_path / 'work').exists()
  # Outside the layers: patch embedding 147,648, position embedding 37,824, cls 192, encoder norm
  # 384, head 193,000. Each layer: 2 LayerNorms 768, q/k/v/out 4 x 37,056, MLP 148,224 + 147,648.
  params = (379_048 + 2 * 444_864) * 4
  dp, fsdp = reports['dp'], reports['fsdp']
  # Adam's mu and nu, plus two int32 step counts (Adam's and the lr schedule's).
  assert dp['param_bytes'] == params and dp['opt_state_bytes'] == 2 * params + 8
  assert params / 8 < fsdp['param_bytes'] < params / 8 * 1.05
  # The compiled program's arguments are the state shard plus the batch shard and the rng.
  for report in reports.values():
    state = report['param_bytes'] + report['opt_state_bytes']
    batch = (224 * 224 * 3 + 1) * 4  # one example per device
    assert state + batch <= report['argument_bytes'] <= state + batch + 64
    assert report['alias_bytes'] >= state - 64  # the donated state is reused for the new state
    assert report['flops'] > 0 and report['temp_bytes'] > 0
  # Per device, FSDP does 1/8 of the batch's work like data parallelism does.
  np.testing.assert_allclose(fsdp['flops'], dp['flops'], rtol=0.05)


@pytest.mark.slow
def test_compile_only_of_a_scanned_encoder_gives_bytes_but_no_flops(tmp_path, capsys):
  """XLA's cost analysis counts a loop's body once: the report gives no FLOPs rather than a
  fraction of them (ViT-Ti/16 at 224 px, one image per device, XLA:CPU: 0.90 GFLOP per device
  scanned, 7.72 unrolled)."""
  common = dict(compile_only=True, data_dir=str(tmp_path / 'no_data'))
  unrolled = loop.train_and_evaluate(_config(**common), str(tmp_path / 'a'))
  assert 'TFLOP per train step per device' in capsys.readouterr().out
  scanned = loop.train_and_evaluate(_config(**common, **{'model.scan': True}), str(tmp_path / 'b'))
  out = capsys.readouterr().out
  assert unrolled['flops'] > 0 and unrolled['eval']['flops'] > 0
  assert scanned['flops'] is None and scanned['eval']['flops'] is None
  assert "FLOPs not counted (XLA counts a scanned encoder's loop once" in out
  assert 'TFLOP' not in out
  for key in ('param_bytes', 'opt_state_bytes', 'argument_bytes'):
    assert scanned[key] == unrolled[key], key  # the same arrays, stacked


@pytest.mark.slow
def test_remat_policies_keep_gradients_and_recompute():
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 28, 28, 1))
  labels = jnp.arange(4)

  def grads_and_flops(remat):
    model = models.create_model('ViT-Ze/4', num_classes=10, remat=remat)
    params = model.init(jax.random.PRNGKey(0), x, train=False)['params']
    params = jax.tree.map(lambda p: p + 0.01, params)  # non-zero head: every grad is non-trivial

    def loss(p):
      logits = model.apply({'params': p}, x, train=False)
      return jnp.mean(losses.softmax_xent(logits, jax.nn.one_hot(labels, 10)))

    fn = jax.jit(jax.grad(loss))
    return fn(params), fn.lower(params).compile().cost_analysis()['flops']

  plain, plain_flops = grads_and_flops('none')
  flops = {}
  for policy in ('full', 'dots'):
    remat, flops[policy] = grads_and_flops(policy)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain,
                 remat)
  # 'full' recomputes each block's forward pass; 'dots' keeps the Dense outputs and recomputes
  # only the rest (softmax, GELU, norms, attention matmuls).
  assert flops['full'] > plain_flops * 1.05
  assert plain_flops < flops['dots'] < flops['full']


@pytest.mark.slow
def test_train_step_compiled_in_background_is_the_jitted_step():
  """The trainer's overlapped compile (Program.compile_train_step_in_background) gives the
  jitted step's exact state and metrics, here on a data x model mesh of 4 devices."""
  config = mnist5k.get_config()
  ours.set_benchmark_values(config, 'ViT-Ze/4', 8, 28, 'float32')
  config.mesh.data, config.mesh.model = 2, 2
  prog = program.build_program(config, jax.devices()[:4], require_dataset=False)
  future = prog.compile_train_step_in_background()
  batch = sharding.shard_batch(
      ours._synthetic_batch(8, 28, prog.num_classes), prog.mesh)  # pylint: disable=protected-access
  expected = prog.train_fn(prog.init_state(), batch, prog.dropout_rng, prog.hyper)
  got = future.result()(prog.init_state(), batch, prog.dropout_rng, prog.hyper)
  for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
