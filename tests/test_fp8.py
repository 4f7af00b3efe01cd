"""fp8 dense layers (`model.fp8`, vit_jax/models/fp8.py): the quantised product against a numpy
reference, delayed scaling, the train step's handling of the fp8 state (outside the optimizer,
across micro-batches, devices and skipped steps), the refusal on devices without fp8, and a short
run on mnist5k whose loss curve follows fp32's and which resumes bitwise and exports the official
layout.

XLA:CPU computes fp8 dots with the fp8 operands widened to float32, so the arithmetic is the GPU's
up to the float32 accumulation order; the test-only switch `program.FP8_EMULATION_FOR_TESTS` lets a
run through the trainer use it on this CPU.
"""

import collections
import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from vit_jax import models
from vit_jax.tools.benchmarking import compare
from vit_jax.tools.benchmarking import ours
from vit_jax.configs import mnist5k as mnist5k_config
from vit_jax.errors import UserError
from vit_jax.formats import npz
from vit_jax.models import fp8
from vit_jax.platform import chips
from vit_jax.platform import targets
from vit_jax.serving import bundle as bundle_lib
from vit_jax.train import loop
from vit_jax.train import program
from vit_jax.train import step as step_lib
from helpers import cut_run, train_losses

E4M3_MAX, E5M2_MAX = 448., 57344.
DENSE = ('MultiHeadDotProductAttention_0/query', 'MultiHeadDotProductAttention_0/key',
         'MultiHeadDotProductAttention_0/value', 'MultiHeadDotProductAttention_0/out',
         'MlpBlock_0/Dense_0', 'MlpBlock_0/Dense_1')


@pytest.fixture
def emulated(monkeypatch):
  """fp8 runs through the trainer on this CPU (the test-only switch)."""
  monkeypatch.setenv(program.FP8_EMULATION_FOR_TESTS, '1')


def _paths(tree) -> dict:
  return {'/'.join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _init(model, images):
  return model.init({'params': jax.random.PRNGKey(0)}, images[:1], train=False)


@pytest.mark.slow
def test_fp8_state_covers_the_encoders_dense_layers_and_leaves_params_as_they_are():
  images = jnp.zeros((1, 28, 28, 1))
  variables = _init(models.create_model('ViT-Ze/4', num_classes=10, fp8=True), images)
  plain = _init(models.create_model('ViT-Ze/4', num_classes=10), images)
  params, state = fp8.split(variables)
  assert set(variables) == {'params', fp8.COLLECTION}
  # The params: the official tree, exactly the plain model's (names, shapes and values).
  jax.tree.map(np.testing.assert_array_equal, params, plain['params'])
  # Six dense layers per block (not the patch embedding, pre-logits or head), six arrays each.
  got = collections.defaultdict(dict)
  for path, leaf in _paths(state).items():
    layer, name = path.rsplit('/Fp8Dot_0/', 1)
    got[layer][name] = leaf
  assert sorted(got) == sorted(f'Transformer/encoderblock_{i}/{d}' for i in range(2) for d in DENSE)
  for arrays in got.values():
    assert {n: (a.shape, float(a.max())) for n, a in arrays.items()} == {
        n: (shape, value) for n, shape, value in fp8.STATE}
  # The scanned encoder stacks them like its params.
  scanned = jax.eval_shape(functools.partial(
      _init, models.create_model('ViT-Ze/4', num_classes=10, fp8=True, scan=True)), images)
  assert _paths(scanned[fp8.COLLECTION])[
      'Transformer/encoderblock/MlpBlock_0/Dense_0/Fp8Dot_0/input_amax_history'].shape == (
          2, fp8.AMAX_HISTORY)


def _q(x, dtype, scale):
  """numpy reference of fp8 quantisation: x / scale, clipped to the format's range, rounded."""
  limit = float(ml_dtypes.finfo(dtype).max)
  return np.clip(np.asarray(x, np.float32) / scale, -limit, limit).astype(dtype).astype(np.float32)


@pytest.mark.slow
def test_the_fp8_product_and_its_delayed_scales_against_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(0, 3, (5, 24)).astype(np.float32)
  dense = nn.Dense(16, dot_general_cls=fp8.Fp8Dot)
  variables = dense.init(jax.random.PRNGKey(1), x)
  kernel, bias = (np.asarray(variables['params'][k]) for k in ('kernel', 'bias'))
  state = variables[fp8.COLLECTION]['Fp8Dot_0']
  # Without the state the layer is the plain Dense; with a fresh state (scales 1, empty history)
  # it multiplies x and the kernel rounded to e4m3.
  np.testing.assert_array_equal(dense.apply({'params': variables['params']}, x),
                                nn.Dense(16).apply({'params': variables['params']}, x))
  e4m3 = ml_dtypes.float8_e4m3fn
  np.testing.assert_allclose(dense.apply(variables, x),
                             _q(x, e4m3, 1.) @ _q(kernel, e4m3, 1.) + bias, rtol=1e-6, atol=1e-6)

  # One backward pass: the state's "gradient" is its next value. The scale for the next step is
  # the history's amax over the format's maximum; the history gains this step's amax.
  g = rng.normal(0, 1e-3, (5, 16)).astype(np.float32)
  loss = lambda p, s, x: jnp.sum(dense.apply({'params': p, fp8.COLLECTION: s}, x) * g)
  grads, new = jax.grad(loss, argnums=(0, 1))(variables['params'], variables[fp8.COLLECTION], x)
  new = new['Fp8Dot_0']
  for name, value in (('input', np.abs(x).max()), ('kernel', np.abs(kernel).max()),
                      ('output_grad', np.abs(g).max())):
    history = np.asarray(new[f'{name}_amax_history'])
    assert history[0] == pytest.approx(value, rel=1e-6) and not history[1:].any(), name
    assert float(new[f'{name}_scale'][0]) == 1.  # delayed: the old (empty) history decides
  # The output gradient was rounded to e5m2 at scale 1 before both products.
  np.testing.assert_allclose(grads['kernel'], _q(x, e4m3, 1.).T @ _q(g, ml_dtypes.float8_e5m2, 1.),
                             rtol=1e-5, atol=1e-9)

  # The next step quantises with the scales the history gives, e.g. x / (amax / 448).
  variables2 = {'params': variables['params'], fp8.COLLECTION: {'Fp8Dot_0': new}}
  _, newer = jax.grad(loss, argnums=(0, 1))(variables['params'], variables2[fp8.COLLECTION], x)
  sx, sk = np.abs(x).max() / E4M3_MAX, np.abs(kernel).max() / E4M3_MAX
  np.testing.assert_allclose(newer['Fp8Dot_0']['input_scale'], [sx], rtol=1e-6)
  np.testing.assert_allclose(newer['Fp8Dot_0']['output_grad_scale'],
                             [np.abs(g).max() / E5M2_MAX], rtol=1e-6)
  reference = (_q(x, e4m3, np.float32(sx)) * sx) @ (_q(kernel, e4m3, np.float32(sk)) * sk) + bias
  out = dense.apply(variables2, x)
  np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)
  # Scaled, e4m3 keeps about 2 significant bits more than at scale 1 for these magnitudes.
  exact = x @ kernel + bias
  assert (np.abs(out - exact).mean() < np.abs(dense.apply(variables, x) - exact).mean())


class _Device:
  """A device as JAX describes it (platform, device_kind, compute_capability on CUDA)."""

  def __init__(self, platform, kind, capability=None):
    self.platform, self.device_kind = platform, kind
    if capability is not None:
      self.compute_capability = capability


@pytest.mark.parametrize('device, refused', [
    (_Device('gpu', 'NVIDIA H100 80GB HBM3', '9.0'), None),
    (_Device('gpu', 'NVIDIA L4', '8.9'), None),
    (_Device('gpu', 'NVIDIA GeForce RTX 4090', '8.9'), None),  # not in the table: its capability
    (_Device('gpu', 'NVIDIA H200'), None),  # a compile-only device: the table
    (_Device('gpu', 'NVIDIA A100-SXM4-80GB', '8.0'), 'compute capability 8.0, below the 8.9'),
    (_Device('cpu', 'cpu'), 'cpu has no fp8 matmul units'),
    (_Device('tpu', 'TPU v5 lite'), 'TPU v5 lite has no fp8 matmul units'),
])
def test_fp8_is_refused_in_one_line_where_the_device_has_no_fp8(device, refused, monkeypatch):
  reason = chips.fp8_support(device)
  assert (reason is None) == (refused is None) and (refused is None or refused in reason)
  config = mnist5k_config.get_config('model_name=ViT-Ze/4')
  config.model.fp8 = True
  if refused is None:
    program.check_fp8(config, [device])
  else:
    with pytest.raises(UserError) as err:
      program.check_fp8(config, [device, _Device('gpu', 'NVIDIA H200', '9.0')])
    message = str(err.value)
    assert message.startswith('config.model.fp8=True needs an NVIDIA GPU with fp8 tensor cores')
    assert refused in message and message.endswith('set config.model.fp8=False (or train on '
                                                    'such a GPU)') and '\n' not in message
    monkeypatch.setenv(program.FP8_EMULATION_FOR_TESTS, '1')
    program.check_fp8(config, [device])  # the tests' switch
  config.model.fp8 = False
  program.check_fp8(config, [_Device('cpu', 'cpu')])


def test_the_chip_table_knows_which_chips_multiply_in_fp8():
  assert chips.find_chip('NVIDIA H100 80GB HBM3').fp8_flops == 2 * chips.find_chip(
      'NVIDIA H100 80GB HBM3').bf16_flops
  assert chips.find_chip('NVIDIA H200').fp8_flops == 1979e12
  assert chips.find_chip('NVIDIA L4').fp8_flops == 242.5e12
  assert chips.find_chip('NVIDIA A100-SXM4-80GB').fp8_flops is None
  assert all(chip.fp8_flops is None for chip in chips.CHIPS if chip.platform == 'tpu')


def test_the_trainer_refuses_fp8_on_this_cpu_before_building_anything(tmp_path):
  config = mnist5k_config.get_config('model_name=ViT-Ze/4,steps=2')
  config.model.fp8 = True
  with pytest.raises(UserError, match='config.model.fp8=True needs an NVIDIA GPU.*cpu has no'):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')
  # A BiT has no fp8 layers: the option policy refuses it (models/options.py).
  with pytest.raises(UserError, match="model.fp8=True does not apply to BiT-R50x1"):
    models.create_model('BiT-R50x1', num_classes=10, fp8=True)


@pytest.mark.slow
def test_xla_gpu_makes_the_fp8_dots_cublaslt_fp8_gemms():
  """Compiled here for an H100 (XLA:GPU's compiler, `make gpu-compiler`): each fp8 layer's three
  products (forward, input and kernel gradients) are cuBLASLt fp8 GEMMs, 2 blocks x 6 layers x 3;
  the same step without fp8 has none, and the fp8 step keeps fewer bf16 GEMMs (attention's and
  the head's: 15 against 43)."""
  calls = {}
  for fp8_on in (True, False):
    config = mnist5k_config.get_config()
    ours.set_benchmark_values(config, 'ViT-Ze/4', 16, 28, 'bfloat16')
    config.model.update(fp8=fp8_on, attention='einsum')
    calls[fp8_on] = ours.compile_for(config, targets.parse('h100'), 'train')['library_calls']
  fp8_gemms = '__cublas$lt$matmul$f8'
  assert calls[True].get(fp8_gemms) == 2 * 6 * 3 and fp8_gemms not in calls[False]
  bf16_gemms = '__cublas$lt$matmul'
  assert 0 < calls[True][bf16_gemms] < calls[False][bf16_gemms], calls


def test_a_forward_pass_benchmark_refuses_fp8_it_would_not_use():
  config = mnist5k_config.get_config()
  config.model.fp8 = True
  with pytest.raises(UserError, match=r'--mode=infer\) runs them in --dtype: drop it or use '
                                      r'--mode=train'):
    compare.run_benchmark(config, model='ViT-Ze/4', batch_size=8, image_size=28, mode='infer',
                          dtype='float32', steps=1)


def _program(devices=1, fp8_on=True, **overrides):
  config = mnist5k_config.get_config('model_name=ViT-Ze/4,steps=10,batch_size=16,lr=3e-3')
  config.warmup_steps = 1
  config.model.fp8 = fp8_on
  for key, value in overrides.items():
    config[key] = value
  return program.build_program(config, jax.devices()[:devices])


def _batch(rows=16, nan=False):
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (rows, 28, 28, 1)).astype(np.float32)
  if nan:
    images[0, 0, 0, 0] = np.nan
  return {'image': jnp.asarray(images), 'label': jnp.asarray(np.arange(rows) % 10, jnp.int32)}


def _histories(state, name='input_amax_history'):
  return {p: np.asarray(a) for p, a in _paths(state.fp8).items() if p.endswith(name)}


@pytest.mark.slow
def test_the_train_step_overwrites_fp8_state_outside_the_optimizer(emulated):
  """Two micro-batches add two amaxes to each history; the next step's scales come from them
  (delayed scaling); the optimizer's state is the plain model's; a skipped step keeps it all."""
  prog = _program(weight_decay=0.1, max_nonfinite_steps=2, accum_steps=2)
  state = prog.init_state()
  assert isinstance(state, step_lib.Fp8TrainState)
  # No Adam moment, weight decay or clipping for fp8 state: the optimizer's tree is the plain's.
  plain = _program(fp8_on=False).abstract_state
  assert type(plain) is step_lib.TrainState and not step_lib.fp8_state(plain)
  assert jax.tree.structure(state.opt_state) == jax.tree.structure(plain.opt_state)
  batch = _batch()
  state, metrics = prog.train_fn(state, batch, prog.dropout_rng, prog.hyper)
  histories = _histories(state)
  assert len(histories) == 12
  for history in histories.values():  # micro-batch 2's amax at [0], micro-batch 1's at [-1]
    assert history[0] > 0 and history[-1] > 0 and not history[1:-1].any()
  # Delayed scaling: each micro-batch quantised its inputs with the largest amax before its own
  # ([0] holds the newest) over e4m3's maximum.
  for _ in range(2):
    histories = _histories(state)
    for path, scale in _paths(state.fp8).items():
      if path.endswith('/input_scale'):
        history = histories[path.replace('input_scale', 'input_amax_history')]
        assert float(scale[0]) == pytest.approx(history[1:].max() / E4M3_MAX, rel=1e-6)
    state, _ = prog.train_fn(state, batch, prog.dropout_rng, prog.hyper)
  # A skipped (NaN) step keeps the fp8 state with the params.
  before = jax.tree.map(np.asarray, (state.params, state.fp8))
  state, metrics = prog.train_fn(state, _batch(nan=True), prog.dropout_rng, prog.hyper)
  assert float(metrics['nonfinite']) == 1. and int(state.skipped) == 1
  jax.tree.map(np.testing.assert_array_equal, before, (state.params, state.fp8))


@pytest.mark.slow
def test_the_pmap_path_reduces_amaxes_over_its_devices(emulated):
  """The per-device 'pmap' step takes the maximum of its devices' amaxes: the global batch's, as
  the 'jit' step computes them (and no single device's)."""
  batch = _batch()
  states = {}
  for parallelism in ('jit', 'pmap'):
    prog = _program(devices=2, parallelism=parallelism)
    states[parallelism], _ = prog.train_fn(prog.init_state(), batch, prog.dropout_rng, prog.hyper)
  jit, pmap = _histories(states['jit']), _histories(states['pmap'])
  assert len(jit) == 12
  for path, history in jit.items():
    np.testing.assert_allclose(pmap[path], history, rtol=1e-5)


def _run_config(data_dir, steps=60, **overrides):
  config = mnist5k_config.get_config(f'model_name=ViT-Ze/4,steps={steps},batch_size=32,lr=3e-3')
  config.data_dir = data_dir
  config.warmup_steps = 5
  config.eval_every = steps
  config.checkpoint_every = steps // 2
  config.log_every = 10
  config.progress = False
  for key, value in overrides.items():
    config.model[key] = value
  return config


@pytest.mark.slow
def test_a_short_fp8_run_follows_fp32_resumes_bitwise_and_exports_the_official_layout(
    tmp_path, data_dir, emulated):
  """60 steps of ViT-Ze/4 on mnist5k, the same config and seeds in fp32 and with fp8 dense layers
  (fp32 elsewhere): each logged loss (a mean over 10 steps) within 0.1 of fp32's and their mean
  difference below 0.05 (measured here: 0.056 and 0.033; bf16 against fp32 at 100 steps: 0.021
  and 0.006). A run cut after step 30 resumes to the same params and fp8 state, bit for bit."""
  fp32_dir, fp8_dir = str(tmp_path / 'fp32'), str(tmp_path / 'fp8')
  fp32 = loop.train_and_evaluate(_run_config(data_dir), fp32_dir)
  result = loop.train_and_evaluate(_run_config(data_dir, fp8=True), fp8_dir)
  ours, reference = np.asarray(train_losses(fp8_dir)), np.asarray(train_losses(fp32_dir))
  assert len(ours) == len(reference) == 6
  print(f'fp8 {ours.round(3)}, fp32 {reference.round(3)}')
  difference = np.abs(ours - reference)
  assert 0 < difference.max() < 0.1 and difference.mean() < 0.05, (ours, reference)
  assert ours[-1] < ours[0] - 0.2  # it learns
  assert abs(result['accuracy'] - fp32['accuracy']) < 0.1

  # Resume: the checkpoint holds the fp8 state, and the resumed run ends where the whole one did.
  cut = str(tmp_path / 'cut')
  cut_run(fp8_dir, cut, keep_step=30, drop_step=60)
  resumed = loop.train_and_evaluate(_run_config(data_dir, fp8=True), cut)
  with ocp.StandardCheckpointer() as checkpointer:
    whole, again = (checkpointer.restore(os.path.join(w, 'checkpoints', '60', 'state'))
                    for w in (fp8_dir, cut))
  assert set(whole) == {'step', 'params', 'opt_state', 'skipped', 'fp8'}
  assert len(jax.tree.leaves(whole['fp8'])) == 72 and whole['fp8']
  jax.tree.map(np.testing.assert_array_equal, whole, again)
  assert resumed == result

  # Export: the bundle's .npz has the official layout (the fp32 run's keys), no fp8 state; it
  # loads into the model with or without fp8 and predicts as the checkpoint's params do.
  bundle_lib.save(bundle_lib.resolve(workdir=fp8_dir), str(tmp_path / 'bundle'))
  bundle_lib.save(bundle_lib.resolve(workdir=fp32_dir), str(tmp_path / 'bundle32'))
  keys = lambda d: sorted(npz.read_npz_arrays(str(tmp_path / d / 'params.npz')))
  assert keys('bundle') == keys('bundle32')
  loaded = bundle_lib.load(str(tmp_path / 'bundle'))
  with open(tmp_path / 'bundle' / 'model.json') as f:
    assert json.load(f)['options']['fp8'] is True
  images = _batch(rows=4)['image']
  model = models.create_model('ViT-Ze/4', num_classes=10, fp8=True)
  np.testing.assert_array_equal(
      model.apply({'params': loaded.params}, images, train=False),
      model.apply({'params': whole['params']}, images, train=False))

