"""model.attention (vit_jax/models/attention.py): the kernels against the explicit einsum path,
`auto`'s table, the TPU kernel compiled for a TPU slice by the TPU compiler, and bad input.

The flash (Pallas splash) kernel cannot run on this CPU. Here its numerics run in Pallas
interpret mode (the kernel's own program, interpreted by XLA:CPU), on one device and per shard
under the 8-device mesh, and its train step compiles for TPU v3 with the Mosaic kernel in the
HLO. What remains unverified on real TPUs: the numerics of the compiled Mosaic kernel on TPU
hardware (interpret mode runs the same kernel program, not its TPU lowering), its speed, and the
per-core memory the TPU compiler reports for it.
"""

import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.configs import mnist5k
from vit_jax import analysis
from vit_jax.tools.benchmarking import ours
from vit_jax.errors import UserError
from vit_jax.models import attention as attention_lib
from vit_jax.models import create_model
from vit_jax.parallel import mesh as mesh_lib
from vit_jax.parallel import sharding
from vit_jax.platform import targets
from vit_jax import tasks
from vit_jax.tasks import losses
from vit_jax.train import program

# The splash kernels of one attention layer's forward and backward, as the HLO names them.
SPLASH_KERNELS = ('splash_mha_fwd_residuals', 'splash_mha_dq_no_residuals',
                  'splash_mha_dkv_no_residuals')


def _images(n=8, size=28, seed=0):
  return jnp.asarray(np.random.RandomState(seed).uniform(-1., 1., (n, size, size, 1)),
                     jnp.float32)


def _params(name, x):
  """Initialised params with a random head (the zero-init head would hide everything else)."""
  params = create_model(name, num_classes=10).init(jax.random.key(0), x[:1], train=False)['params']
  params['head']['kernel'] = jnp.asarray(
      np.random.RandomState(1).normal(size=params['head']['kernel'].shape), jnp.float32)
  return params


def _logits_and_grads(model, params, x, mesh=None):
  """Logits and the gradient of a cross-entropy loss (train=True), jitted; under `mesh` as the
  trainer runs them: params and batch sharded by the policy, activation constraints on."""
  labels = jax.nn.one_hot(jnp.arange(x.shape[0]) % 10, 10)

  def fn(p, x):
    def loss(p):
      logits = model.apply({'params': p}, x, train=True)
      return jnp.mean(losses.softmax_xent(logits, labels)), logits
    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(p)
    return logits, grads

  if mesh is None:
    return jax.jit(fn)(params, x)
  p_sh = sharding.param_shardings(params, mesh)
  fn = jax.jit(sharding.with_activation_sharding(fn, mesh),
               in_shardings=(p_sh, sharding.batch_sharding(mesh)))
  return fn(jax.device_put(params, p_sh), jax.device_put(x, sharding.batch_sharding(mesh)))


@functools.lru_cache(maxsize=None)
def _einsum_reference(name):
  """(images, params, (logits, grads) of the einsum kernel on one device)."""
  x = _images()
  params = _params(name, x)
  model = create_model(name, num_classes=10, attention='einsum')
  return x, params, _logits_and_grads(model, params, x)


def _rel(a, b) -> float:
  """Largest difference relative to the largest magnitude of the reference `b`."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / np.abs(b).max())


def _assert_same(got, want, rtol=1e-5):
  """Logits and every gradient leaf within `rtol` of the reference's largest magnitude. The
  key bias's exact gradient is zero (softmax ignores a constant added to a row of logits): both
  are rounding noise, checked against the largest gradient of all."""
  (logits, grads), (ref_logits, ref_grads) = got, want
  assert _rel(logits, ref_logits) <= rtol
  flat, ref_flat = jax.tree.leaves_with_path(grads), jax.tree.leaves(ref_grads)
  assert len(flat) == len(ref_flat)
  scale = max(float(np.abs(np.asarray(r)).max()) for r in ref_flat)
  for (path, g), r in zip(flat, ref_flat):
    name = jax.tree_util.keystr(path)
    if "['key']['bias']" in name:
      assert np.abs(np.asarray(g)).max() <= rtol * scale, name
      assert np.abs(np.asarray(r)).max() <= rtol * scale, name
      continue
    assert np.abs(np.asarray(r)).max() > 0, name  # every gradient is exercised
    assert _rel(g, r) <= rtol, (name, _rel(g, r))


def _data_x_model_mesh():
  """4 x 2 over the 8 simulated devices: ViT-Ze/4's 2 heads split over 'model'."""
  return mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=4, fsdp=1, model=2)))


# ---------------------------------------------------------------------------------------------
# dot_product against einsum on CPU (fp32).


@pytest.mark.parametrize('name', ['ViT-Ze/4', 'R+ViT-Ze/4'])
@pytest.mark.slow
def test_dot_product_matches_einsum(name):
  x, params, want = _einsum_reference(name)
  model = create_model(name, num_classes=10, attention='dot_product')
  _assert_same(_logits_and_grads(model, params, x), want)


@pytest.mark.parametrize('remat', ['full', 'dots'])
@pytest.mark.slow
def test_dot_product_matches_einsum_under_remat(remat):
  x, params, want = _einsum_reference('ViT-Ze/4')
  model = create_model('ViT-Ze/4', num_classes=10, attention='dot_product', remat=remat)
  _assert_same(_logits_and_grads(model, params, x), want)


@pytest.mark.parametrize('name', ['ViT-Ze/4', 'R+ViT-Ze/4'])
def test_dot_product_matches_einsum_on_a_data_x_model_mesh(name):
  x, params, want = _einsum_reference(name)
  model = create_model(name, num_classes=10, attention='dot_product')
  _assert_same(_logits_and_grads(model, params, x, _data_x_model_mesh()), want)


# ---------------------------------------------------------------------------------------------
# flash in Pallas interpret mode on CPU: padded sequence (50 tokens -> 128), masked keys.


@pytest.mark.slow
def test_flash_interpret_matches_einsum_at_a_padded_length():
  """ViT-Ze/4 at 28 px has 50 tokens (49 patches + cls), padded to 128 for the kernel: on one
  device, and per shard in jax.shard_map on the 8-device data x model mesh (the jitted steps'
  path)."""
  x, params, want = _einsum_reference('ViT-Ze/4')
  model = create_model('ViT-Ze/4', num_classes=10, attention='flash')
  with attention_lib.interpret_flash():
    _assert_same(_logits_and_grads(model, params, x), want)
    _assert_same(_logits_and_grads(model, params, x, _data_x_model_mesh()), want)


def test_flash_refuses_to_run_off_tpu():
  x = _images(2)
  model = create_model('ViT-Ze/4', num_classes=10, attention='flash')
  with pytest.raises(UserError) as err:
    model.init(jax.random.key(0), x, train=False)
  message = str(err.value)
  assert '\n' not in message
  assert 'model.attention=flash' in message and 'cpu' in message and 'auto' in message


# ---------------------------------------------------------------------------------------------
# cudnn's padded, masked call, run by XLA on CPU: 50 tokens padded to 64, 14 padded keys masked.


@pytest.mark.parametrize('name', ['ViT-Ze/4', 'R+ViT-Ze/4'])
@pytest.mark.slow
def test_cudnn_padding_and_mask_match_einsum(name):
  """Logits and every gradient equal the einsum kernel's, on one device and on the 8-device
  data x model mesh (the jitted steps' path)."""
  x, params, want = _einsum_reference(name)
  model = create_model(name, num_classes=10, attention='cudnn')
  with attention_lib.cudnn_as_xla():
    _assert_same(_logits_and_grads(model, params, x), want)
    _assert_same(_logits_and_grads(model, params, x, _data_x_model_mesh()), want)


def test_cudnn_pads_to_its_multiple_and_masks_only_the_padding():
  """Straight on [B, N, H, hd] arrays: keys and values beyond the real N (here large
  numbers placed in the padded rows by hand) change nothing; the padded length is the multiple."""
  assert attention_lib.padded_length(197, attention_lib.CUDNN_MULTIPLE) == 200
  assert attention_lib.padded_length(200, attention_lib.CUDNN_MULTIPLE) == 200
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 50, 2, 16)), jnp.float32) for _ in range(3))
  padded = attention_lib.pad_tokens(k, attention_lib.CUDNN_MULTIPLE, axis=1)
  assert padded.shape == (2, 56, 2, 16) and not np.asarray(padded[:, 50:]).any()
  want = jax.nn.dot_product_attention(q, k, v, scale=1.0, implementation='xla')
  with attention_lib.cudnn_as_xla():
    got = attention_lib.cudnn(q, k, v)
  assert got.shape == q.shape
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_cudnn_refuses_where_it_cannot_run():
  x = _images(2)
  model = create_model('ViT-Ze/4', num_classes=10, attention='cudnn')
  with pytest.raises(UserError) as err:  # the backend
    model.init(jax.random.key(0), x, train=False)
  assert '\n' not in str(err.value)
  assert 'model.attention=cudnn' in str(err.value) and 'runs on cpu' in str(err.value)
  with attention_lib.cudnn_as_xla(float32=False):  # fp32
    with pytest.raises(UserError, match='runs in bfloat16 or float16.*config.model.dtype=bfloat16'):
      model.init(jax.random.key(0), x, train=False)
    bf16 = create_model('ViT-Ze/4', num_classes=10, attention='cudnn', dtype='bfloat16')
    assert bf16.init(jax.random.key(0), x, train=False)['params']
    odd = bf16.clone(hidden_size=40, num_heads=4)  # head_dim 10
    with pytest.raises(UserError, match='multiple of 8, and this model has 10'):
      odd.init(jax.random.key(0), x, train=False)


# ---------------------------------------------------------------------------------------------
# auto: one table, resolved for the platform the trace compiles for.


def test_auto_resolves_per_backend_as_the_table_says():
  assert set(attention_lib.AUTO) == {'cpu', 'gpu', 'tpu'}
  assert attention_lib.AUTO['tpu'] == 'flash' and attention_lib.AUTO['gpu'] == 'cudnn'
  for on, kernel in attention_lib.AUTO.items():
    assert attention_lib.resolve('auto', 0., on) == kernel
    # Attention dropout: only einsum has it, on every backend.
    assert attention_lib.resolve('auto', 0.1, on) == 'einsum'
  # On a GPU auto's cudnn falls back to einsum where cuDNN cannot run: fp32, head_dim 12.
  assert attention_lib.resolve('auto', 0., 'gpu', jnp.bfloat16, 64) == 'cudnn'
  assert attention_lib.resolve('auto', 0., 'gpu', jnp.float16, 80) == 'cudnn'
  assert attention_lib.resolve('auto', 0., 'gpu', jnp.float32, 64) == 'einsum'
  assert attention_lib.resolve('auto', 0., 'gpu', jnp.bfloat16, 12) == 'einsum'
  for kernel in ('einsum', 'dot_product', 'cudnn'):
    assert attention_lib.resolve(kernel, 0., 'gpu') == kernel
  # Here (CPU, no mesh) the model runs the CPU entry: only einsum sows attention weights.
  assert attention_lib.platform() == 'cpu'
  x = _images(2)
  model = create_model('ViT-Ze/4', num_classes=10)
  assert model.attention == 'auto'
  _, state = model.init_with_output(jax.random.key(0), x, train=False,
                                    mutable=['params', 'intermediates'])
  assert ('intermediates' in state) == (attention_lib.AUTO['cpu'] == 'einsum')


@pytest.fixture
def tpu_v3_2x2():
  """The 8 cores of a TPU v3-8 slice, from the TPU compiler (no TPU needed; `make test`
  installs it)."""
  return targets.devices(targets.parse('v3-8'))


def test_auto_resolves_for_the_mesh_platform(tpu_v3_2x2):
  """Traced for TPU devices from this CPU host: the active mesh (jit path) and a shard_map's
  abstract mesh (pmap path) name the platform; auto then traces the Pallas kernel."""
  mesh = jax.make_mesh((8, 1, 1), mesh_lib.AXES, devices=tpu_v3_2x2,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  with sharding.activation_sharding(mesh):
    assert attention_lib.platform() == 'tpu'
  seen = []
  body = lambda x: seen.append(attention_lib.platform()) or x
  spec = P(('data', 'fsdp'))
  jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)).lower(
      jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, spec)))
  assert seen == ['tpu']
  model = create_model('ViT-Ze/4', num_classes=10)
  x = jax.ShapeDtypeStruct((8, 28, 28, 1), jnp.float32)
  init = lambda x: model.init(jax.random.key(0), x, train=False)
  assert 'pallas_call' not in str(jax.make_jaxpr(init)(x))
  assert 'pallas_call' in str(jax.make_jaxpr(sharding.with_activation_sharding(init, mesh))(x))


# ---------------------------------------------------------------------------------------------
# flash compiled by the TPU compiler for a v3-8 slice.


# The persistent compilation cache (tests/conftest.py) cannot load a TPU executable without a
# TPU client: JAX warns and compiles.
@pytest.mark.filterwarnings('ignore:Error reading persistent compilation cache entry')
@pytest.mark.parametrize('mesh_model, dtype', [(1, 'float32'), (2, 'float32'), (1, 'bfloat16')],
                         ids=['data', 'data_x_model', 'data_bf16'])
@pytest.mark.slow
def test_flash_train_step_compiles_for_tpu_v3(tpu_v3_2x2, mesh_model, dtype):
  """ViT-Ze/4 at 28 px (50 tokens, padded to 128), global batch 16 on 8 v3 cores: data
  parallel (8 x 1) and data x model (4 x 2, one head per core); with bf16 compute the kernel
  runs in float32 on v3 (FLASH_FLOAT32_CHIPS: Mosaic does not compile its bf16 matmuls there)."""
  config = mnist5k.get_config()
  ours.set_benchmark_values(config, 'ViT-Ze/4', 16, 28, dtype)
  config.mesh.data, config.mesh.model = -1, mesh_model
  config.model.attention = 'flash'
  prog = program.build_program(config, tpu_v3_2x2, require_dataset=False)
  assert dict(prog.mesh.shape) == {'data': 8 // mesh_model, 'fsdp': 1, 'model': mesh_model}
  compiled = prog.train_fn.lower(*prog.abstract_train_args()).compile()
  hlo = compiled.as_text()
  # One Mosaic custom call per kernel per layer (2 layers): forward, dq and dkv.
  assert len(re.findall(r'custom_call_target="tpu_custom_call"', hlo)) == 3 * 2
  for kernel in SPLASH_KERNELS:
    assert kernel in hlo
  assert compiled.memory_analysis().temp_size_in_bytes > 0


# ---------------------------------------------------------------------------------------------
# The analysis reads attention weights whatever kernel the run used.


def test_analysis_forces_einsum():
  x = _images(2)
  params = _params('ViT-Ze/4', x)
  model = create_model('ViT-Ze/4', num_classes=10, attention='dot_product')
  logits, attn = analysis.forward_with_attention(model, params, np.asarray(x))
  assert attn.shape == (2, 2, 2, 50, 50)  # [layers, images, heads, N, N]
  np.testing.assert_allclose(attn.sum(-1), 1., rtol=1e-5)
  assert _rel(logits, model.apply({'params': params}, x, train=False)) <= 1e-5


def test_a_runs_model_spec_leaves_the_kernel_to_where_it_runs():
  """A run trained with flash on TPU: its exports, few-shot and analysis build the model on any
  host (tasks.model_spec drops the kernel; the model resolves `auto` there)."""
  x = _images(2)
  params = _params('ViT-Ze/4', x)
  config = mnist5k.get_config()
  config.model_name, config.model.attention = 'ViT-Ze/4', 'flash'
  model = tasks.get_task(config).model_spec(params).build()
  assert model.attention == 'auto'
  want = create_model('ViT-Ze/4', num_classes=10, attention='einsum').apply({'params': params}, x,
                                                                           train=False)
  assert _rel(model.apply({'params': params}, x, train=False), want) <= 1e-5


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the config keys.


@pytest.mark.parametrize('kernel', ['flash', 'dot_product', 'cudnn'])
def test_attention_dropout_needs_the_einsum_kernel(kernel):
  with pytest.raises(UserError) as err:
    create_model('ViT-Ze/4', num_classes=10, attention=kernel, attention_dropout_rate=0.1)
  message = str(err.value)
  assert '\n' not in message
  assert f'model.attention={kernel}' in message and 'model.attention_dropout_rate' in message
  # The module checks its own fields too (it can be built without create_model).
  model = create_model('ViT-Ze/4', num_classes=10).clone(attention=kernel,
                                                         attention_dropout_rate=0.1)
  with pytest.raises(UserError, match='model.attention_dropout_rate'):
    model.init(jax.random.key(0), _images(1), train=False)
  # auto and einsum apply it.
  for ok in ('auto', 'einsum'):
    create_model('ViT-Ze/4', num_classes=10, attention=ok, attention_dropout_rate=0.1)


def test_unknown_attention_lists_the_valid_values():
  with pytest.raises(UserError) as err:
    create_model('ViT-Ze/4', num_classes=10, attention='splash')
  message = str(err.value)
  assert '\n' not in message
  assert message == ("unknown attention 'splash': use model.attention= one of auto, einsum, "
                     'dot_product, cudnn, flash')


def test_bit_accepts_only_the_neutral_default():
  assert create_model('BiT-R14x0.5', num_classes=10, attention='auto') is not None
  with pytest.raises(UserError, match="attention='flash' does not apply to BiT-R14x0.5"):
    create_model('BiT-R14x0.5', num_classes=10, attention='flash')


def test_auto_compiles_for_a_gpu_without_cudnn_with_einsum():
  """A compile for a GPU that is not here (`compile_for=h100`: XLA:GPU's compiler, no cuDNN):
  traced under a mesh of that GPU, bf16 `auto` takes einsum, and `cudnn` is refused in one
  line, rather than failing in JAX's cuDNN lowering."""
  h100 = targets.devices(targets.parse('h100'))
  mesh = jax.make_mesh((1, 1, 1), mesh_lib.AXES, devices=h100,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  with sharding.activation_sharding(mesh):
    assert attention_lib.platform() == 'gpu'
    assert attention_lib.resolve('auto', 0., dtype=jnp.bfloat16, head_dim=64) == 'einsum'
    with pytest.raises(UserError) as err:
      attention_lib.resolve('cudnn', 0.)
  assert str(err.value).startswith('model.attention=cudnn needs cuDNN, which JAX does not find')
  # With cuDNN installed (the platform named, as on the GPU itself) auto takes cudnn.
  assert attention_lib.resolve('auto', 0., 'gpu', jnp.bfloat16, 64) == 'cudnn'
