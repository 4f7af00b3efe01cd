"""The attention kernels `model.attention` selects, and the one table `auto` resolves by.

  einsum       the explicit path in `vit.MultiHeadDotProductAttention`: [B, heads, N, N] weights
               from two heads-major einsums. The only kernel that sows the attention weights
               (`intermediates/.../attention_weights`, which `vit_jax.analysis` reads) and the only
               one that applies attention dropout.
  dot_product  `jax.nn.dot_product_attention` with implementation=None: XLA's fused attention, or
               on a GPU whichever implementation JAX picks (cuDNN where it applies).
  cudnn        `jax.nn.dot_product_attention` with implementation='cudnn': cuDNN's fused (flash)
               attention on an NVIDIA GPU; bf16/fp16 only, head_dim a multiple of 8 (at most 128,
               256 from Hopper on). Refused with one line anywhere else.
  flash        the Pallas TPU splash-attention kernel (`jax.experimental.pallas.ops.tpu.
               splash_attention`): blockwise softmax, the N x N weights never exist in HBM. Runs
               only on TPU (or in Pallas interpret mode, `interpret_flash`, for tests).
  auto         per backend, when the step is traced: `AUTO`.

Both fused kernels take the scaled queries, keys and values as the projections write them,
[B, N, heads, head_dim], and return the attended values in the same layout.

Why splash and not `pallas.ops.tpu.flash_attention`: both compile for TPU v3 at ViT's shapes
(head_dim 64 and 80, N = 1,370 padded to 1,408), but for one H/14 attention at 518 px, batch 2,
forward + backward, the TPU compiler gives splash 183 MB of temporaries and flash_attention
298 MB (einsum: 504 MB); splash's static mask makes the kernel skip key blocks that are all
padding; and it takes `interpret=True`, so its numerics are tested on CPU.

ViT's sequence lengths (197, 577, 1025, 1370 tokens with cls) are not multiples of the kernel's
128-token blocks: `flash` pads the sequence to the next multiple of 128, masks the padded keys
(every query, padded ones included, sees exactly the N real keys, so no softmax row is empty) and
slices the output back to N rows. `cudnn` pads the same way (`pad_tokens`) to a multiple of
`CUDNN_MULTIPLE`: cuDNN refuses ViT's lengths as they are ("Unsupported sequence length Q 197, KV
197", jax 0.11.2 on an H200). Its padded keys are masked by their count
(`key_value_seq_lengths`, cuDNN's padding mask), not by a bias. `cudnn_as_xla` runs that same
padded, masked call with implementation='xla' on any backend, for testing its numerics.
A Pallas call is not partitioned by the compiler, so under an
active mesh (`vit_jax.parallel.sharding.activation_sharding`, i.e. inside the jitted train and
eval steps) it runs in `jax.shard_map` over the mesh axes the activation rules give batch and
heads ('data', 'fsdp' and 'model'); without one (eager code, the pmap path's per-device program)
it is called directly.
"""

from __future__ import annotations  # jax.Array annotations: JAX loads when a kernel runs

import contextlib
import contextvars
import functools

import numpy as np

from vit_jax import lazy
from vit_jax.errors import UserError
from vit_jax.platform import gpu

# Loaded when a kernel runs: the config's validation reads `ATTENTIONS` and `check` without JAX.
jax = lazy.Module('jax')
jnp = lazy.Module('jax.numpy')
sharding = lazy.Module('vit_jax.parallel.sharding')

ATTENTIONS = ('auto', 'einsum', 'dot_product', 'cudnn', 'flash')
# Kernels without attention dropout (the einsum path applies it).
NO_DROPOUT = ('dot_product', 'cudnn', 'flash')

# `auto`: the kernel of each backend. With model.attention_dropout_rate > 0 auto picks einsum on
# every backend (the only kernel with attention dropout).
#   tpu  flash: no N x N weights in HBM (per-core peak of the plan table, docs/scaling.md)
#   gpu  cudnn where it runs (bf16/fp16, head_dim a multiple of 8, cuDNN loaded), else einsum:
#        the ViT-B/16 train step (batch 256, bf16) is 1.19x faster with cudnn than with einsum
#        and its compiled peak 7 GB lower; XLA's own dot_product is slower than einsum
#        (benchmarks/RESULTS.md, `bench --suite=gpu`). A compile for a GPU that is not here
#        (`compile_for=h100`) has XLA:GPU's compiler but no cuDNN: einsum there.
#   cpu  einsum: dot_product is never faster on CPU (benchmarks/attention_kernels.py), and
#        einsum keeps the attention weights and attention dropout.
AUTO = {'tpu': 'flash', 'gpu': 'cudnn', 'cpu': 'einsum'}

FLASH_BLOCK = 128  # splash's q and kv block; `flash` pads the sequence to a multiple of it
# `cudnn` pads the sequence to a multiple of this: JAX's cuDNN path refuses odd lengths in
# training, and 8 keeps the padded rows (and their saved activations) few: 197 tokens become 200.
CUDNN_MULTIPLE = 8
CUDNN_DTYPES = ('bfloat16', 'float16')
CUDNN_HEAD_DIM_MULTIPLE = 8
# Chips for which Mosaic (libtpu 0.0.42) does not compile the kernel's bf16 matmuls ("Unsupported
# matmul RHS type on target: vector<128x128xbf16>" for v2 and v3 slices; v4 and v5e compile
# them): there `flash` runs in float32 (q, k, v cast up, the output cast back).
FLASH_FLOAT32_CHIPS = ('TPU v2', 'TPU v3')
TOKENS_MAJOR = ('batch', 'tokens', 'heads', 'kv')
HEADS_MAJOR = ('batch', 'heads', 'tokens', 'kv')

_INTERPRET = contextvars.ContextVar('interpret_flash', default=False)
# None, or (in `cudnn_as_xla`) whether float32 is let through to XLA's implementation.
_CUDNN_AS_XLA = contextvars.ContextVar('cudnn_as_xla', default=None)


def check(attention: str, dropout_rate: float) -> None:
  """One-line UserErrors: an unknown kernel, or a kernel without dropout and dropout > 0."""
  if attention not in ATTENTIONS:
    raise UserError(f'unknown model.attention {attention!r}: use one of {", ".join(ATTENTIONS)}')
  if dropout_rate > 0 and attention in NO_DROPOUT:
    raise UserError(f'model.attention={attention} has no attention dropout but '
                    f'model.attention_dropout_rate={dropout_rate}: set '
                    f'config.model.attention_dropout_rate=0, or config.model.attention=einsum '
                    f'(or auto, which picks einsum when attention dropout is on)')


def _family(name: str) -> str:
  return 'gpu' if name in ('cuda', 'rocm') else name


def _target_device():
  """The device (or abstract device) the current trace compiles for: one of the active mesh (the
  jitted steps), else of the enclosing shard_map (the pmap path; its abstract mesh names the
  device kind), else of the default backend. So compiling for a TPU slice from a CPU host
  resolves for TPU."""
  mesh = sharding.active_mesh()
  if mesh is not None:
    return mesh.devices.flat[0]
  device = getattr(jax.sharding.get_abstract_mesh(), 'abstract_device', None)
  return device if device is not None else jax.devices()[0]


def platform() -> str:
  """'cpu', 'gpu' or 'tpu': the platform the current trace compiles for (`_target_device`)."""
  return _family(_target_device().platform)


@contextlib.contextmanager
def interpret_flash():
  """While active, `flash` runs the Pallas kernel in interpret mode on any backend (slow: for
  testing its numerics where there is no TPU)."""
  token = _INTERPRET.set(True)
  try:
    yield
  finally:
    _INTERPRET.reset(token)


def _interpreting() -> bool:
  return _INTERPRET.get()


@contextlib.contextmanager
def cudnn_as_xla(float32: bool = True):
  """While active, `cudnn` runs its padded, masked call with implementation='xla' on any backend
  (for testing the padding and the mask where there is no GPU); `float32` lets fp32 through (XLA
  takes it, cuDNN does not)."""
  token = _CUDNN_AS_XLA.set(float32)
  try:
    yield
  finally:
    _CUDNN_AS_XLA.reset(token)


def resolve(attention: str, dropout_rate: float, on: str = None, dtype=None,
            head_dim: int = None) -> str:
  """The kernel that runs: `attention` itself, or for 'auto' the `AUTO` entry of platform `on`;
  einsum whenever auto meets attention dropout, and where auto's cudnn cannot take the compute
  `dtype` or `head_dim` (when given). `on` None (a trace): the platform the trace compiles for
  (`platform()`), and cudnn only where JAX finds cuDNN in this process; `on` named: what runs
  there with its libraries installed."""
  check(attention, dropout_rate)
  traced = on is None
  on = platform() if traced else on
  cudnn_here = lambda: not traced or gpu.cudnn_available()
  if attention == 'auto':
    kernel = 'einsum' if dropout_rate > 0 else AUTO.get(on, 'einsum')
    if kernel == 'cudnn' and not (cudnn_takes(dtype, head_dim) and cudnn_here()):
      kernel = 'einsum'
    return kernel
  if attention == 'flash' and on != 'tpu' and not _interpreting():
    raise UserError(f'model.attention=flash is a TPU kernel and this program runs on {on}: use '
                    'config.model.attention=auto (or dot_product)')
  if attention == 'cudnn' and _CUDNN_AS_XLA.get() is None:
    if on != 'gpu':
      raise UserError(f'model.attention=cudnn is an NVIDIA GPU kernel (cuDNN) and this program '
                      f'runs on {on}: use config.model.attention=auto (or einsum)')
    if not cudnn_here():
      raise UserError('model.attention=cudnn needs cuDNN, which JAX does not find here (the '
                      'XLA:GPU compiler of `make gpu-compiler` has none): use '
                      'config.model.attention=auto (einsum here) or einsum')
  return attention


def cudnn_takes(dtype, head_dim: int) -> bool:
  """Whether cuDNN's fused attention takes this compute dtype and head dimension (None: not
  known, taken as yes)."""
  return ((dtype is None or jnp.dtype(dtype).name in CUDNN_DTYPES) and
          (head_dim is None or head_dim % CUDNN_HEAD_DIM_MULTIPLE == 0))


def padded_length(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pad_tokens(t: jax.Array, multiple: int, axis: int) -> jax.Array:
  """`t` with zeros appended on `axis` up to a multiple of `multiple`."""
  pad = [(0, 0)] * t.ndim
  pad[axis] = (0, padded_length(t.shape[axis], multiple) - t.shape[axis])
  return jnp.pad(t, pad)


def check_cudnn(dtype, head_dim: int) -> None:
  """One-line UserErrors for what cuDNN's fused attention does not take: fp32, a head_dim that
  is not a multiple of 8."""
  if jnp.dtype(dtype).name not in CUDNN_DTYPES:
    raise UserError(f'model.attention=cudnn runs in bfloat16 or float16, and this model computes '
                    f'in {jnp.dtype(dtype).name}: set config.model.dtype=bfloat16, or use '
                    f'config.model.attention=einsum')
  if head_dim % CUDNN_HEAD_DIM_MULTIPLE:
    raise UserError(f'model.attention=cudnn needs a head dimension (hidden_size / num_heads) that '
                    f'is a multiple of {CUDNN_HEAD_DIM_MULTIPLE}, and this model has {head_dim}: '
                    f'use config.model.attention=einsum')


def dot_product(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """`jax.nn.dot_product_attention` on scaled [B, N, H, hd] inputs."""
  q, k, v = (sharding.constrain(t, TOKENS_MAJOR) for t in (q, k, v))
  y = jax.nn.dot_product_attention(q, k, v, scale=1.0)
  return sharding.constrain(y, TOKENS_MAJOR)


def cudnn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """cuDNN's fused attention on scaled [B, N, H, hd] inputs: the tokens padded to a multiple of
  `CUDNN_MULTIPLE`, the padded keys masked by the real length, the output sliced back to N."""
  as_xla = _CUDNN_AS_XLA.get()
  check_cudnn(jnp.bfloat16 if as_xla else q.dtype, q.shape[-1])
  batch, n = q.shape[0], q.shape[1]
  q, k, v = (sharding.constrain(pad_tokens(t, CUDNN_MULTIPLE, axis=1), TOKENS_MAJOR)
             for t in (q, k, v))
  lengths = jnp.full((batch,), n, jnp.int32)
  y = jax.nn.dot_product_attention(
      q, k, v, scale=1.0, key_value_seq_lengths=lengths,
      implementation='cudnn' if as_xla is None else 'xla')
  return sharding.constrain(y[:, :n], TOKENS_MAJOR)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool) -> jax.Array:
  """Splash attention of [B, H, N, hd] (one device's shard), padded keys masked."""
  # pylint: disable-next=g-import-not-at-top  (Pallas TPU is imported only where it runs)
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  heads, n = q.shape[1], q.shape[2]
  padded = padded_length(n, FLASH_BLOCK)
  real_keys = np.zeros((padded, padded), np.bool_)
  real_keys[:, :n] = True
  kernel = splash.make_splash_mha(
      splash.MultiHeadMask([splash.NumpyMask(real_keys)] * heads), head_shards=1,
      q_seq_shards=1, interpret=interpret)
  y = jax.vmap(kernel)(*(pad_tokens(t, FLASH_BLOCK, axis=2) for t in (q, k, v)))
  return y[:, :, :n]


def flash(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """Splash attention on scaled [B, N, H, hd] inputs, per shard under an active mesh."""
  dtype = q.dtype
  compute = jnp.float32 if _target_device().device_kind in FLASH_FLOAT32_CHIPS else dtype
  q, k, v = (jnp.swapaxes(t, 1, 2).astype(compute) for t in (q, k, v))
  run = functools.partial(_splash, interpret=_interpreting())
  mesh = sharding.active_mesh()
  if mesh is not None and mesh.devices.size > 1:
    spec = sharding.activation_spec(HEADS_MAJOR, q.shape, mesh)
    # check_vma=False: splash's pallas_call declares its outputs without varying-axis types.
    run = jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
  return jnp.swapaxes(run(q, k, v), 1, 2).astype(dtype)


FUSED = {'dot_product': dot_product, 'cudnn': cudnn, 'flash': flash}

__all__ = ['ATTENTIONS', 'AUTO', 'FUSED', 'FLASH_BLOCK', 'CUDNN_MULTIPLE', 'FLASH_FLOAT32_CHIPS',
           'check', 'platform', 'resolve', 'interpret_flash', 'cudnn_as_xla', 'dot_product',
           'cudnn', 'flash', 'pad_tokens', 'padded_length', 'check_cudnn']
