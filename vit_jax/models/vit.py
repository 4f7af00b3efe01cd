"""Vision Transformer (Dosovitskiy et al. 2021) and its hybrid ResNet-stem variants.

Param names equal the original code's linen tree (`models_vit.py`), so the released .npz checkpoints
map 1:1:

  [conv_root, gn_root, block1/unit1/conv1, ...]     hybrid stem (only when `resnet` is set)
  embedding/{kernel,bias}                            patch embedding, Conv p x p stride p
  cls                                                [1,1,D] (classifier 'token' or 'unpooled')
  registers                                          [1,R,D] (num_registers R > 0 only)
  Transformer/posembed_input/pos_embedding           [1,N(+1),D] (posemb 'learned' only)
  Transformer/encoderblock_{i}/LayerNorm_0, MultiHeadDotProductAttention_0/{query,key,value,out},
                               LayerNorm_1, MlpBlock_0/{Dense_0,Dense_1}
  Transformer/encoder_norm
  pre_logits                                         (representation_size only) Dense + tanh
  head                                               zero kernel, bias = head_bias_init
  mask_token                                         [1,1,D] (with_mask_token only: masked patch
                                                     prediction pre-training, vit_jax/tasks/mpp.py)

Activations carry logical axis names (`batch`, `tokens`, `embed`, `heads`, `kv`, `mlp`) through
`vit_jax.parallel.sharding.constrain`, which maps them to mesh axes inside the jitted train step
and does nothing elsewhere. `remat` ('none' | 'full' | 'dots' | 'gelu') rematerialises each
encoder block (scanned, 'none' still recomputes the elementwise ops: `SCAN_NO_REMAT_POLICY`).

`attention` selects the attention kernel (vit_jax/models/attention.py: einsum | dot_product |
cudnn | flash | auto).

`num_registers=R` adds R register tokens (Darcet et al., "Vision Transformers Need Registers";
timm's `reg_tokens`): learned tokens placed after the cls token once the position embedding is
added (they have no position), attended to in every block, and dropped before the head:
`num_prefix_tokens` is the one count of the tokens before the patches (cls and registers) that
every reader of the token sequence skips. R = 0 is the original model with the same params.

`flexi_patch=P` and `flexi_grid=G` make a FlexiViT (vit_jax/models/flexi.py): `embedding/kernel`
stored at P x P and the position embedding's grid at G x G, resized at call time to the patch
size and the token grid, so one set of params runs at any patch size.

`fp8=True` runs the encoder's dense layers (query, key, value, out, Dense_0, Dense_1) through
`vit_jax.models.fp8.Fp8Dot`: fp8 matmuls with delayed scaling, whose scales live in their own
variable collection next to 'params' (the train step's business; without it the same layers run
in `dtype`).

`scan=True` runs the blocks as one `nn.scan`ned layer (`scanned_blocks`): XLA compiles one block
instead of L. Its params are stacked, `Transformer/encoderblock/...` with a leading layer axis
[L, ...], and start equal to the unrolled model's (`init` stacks them); `vit_jax.models.layout`
converts any tree between the two layouts, and every file outside a training run holds the
unrolled names above.

With the einsum kernel every block sows its attention weights [B, heads, N, N] into the
'intermediates' collection (scanned: one [L, B, heads, N, N] under encoderblock;
`layout.unstack_blocks` splits it); `model.apply(..., mutable=['intermediates'])` returns them
without changing the logits, and 'features': what the head sees (the few-shot evaluator's frozen
pre-logit features).
"""

import functools
from typing import Any, Optional, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
import numpy as np

from vit_jax.errors import UserError
from vit_jax.models import attention as attention_lib
from vit_jax.models import flexi as flexi_lib
from vit_jax.models import fp8 as fp8_lib
from vit_jax.models import layout
from vit_jax.models import option_values
from vit_jax.models import resnet as resnet_lib
from vit_jax.models.option_values import REMAT_POLICIES
from vit_jax.parallel.sharding import constrain

Dtype = Any

MLP_HIDDEN = 'mlp_hidden'  # the first Dense's output, the one tensor remat='gelu' keeps
GELU_REMAT_POLICY = jax.checkpoint_policies.save_only_these_names(MLP_HIDDEN)
# remat 'none' of a scanned encoder: XLA fuses the unrolled loop's elementwise ops into their
# consumers and so stores little besides matmul outputs for the backward pass, but it cannot see
# across a scan's iterations, where JAX would store every intermediate [L, ...]. Saving the matmul
# outputs only (no matmul recomputed) keeps the scanned step's memory near the unrolled one's.
SCAN_NO_REMAT_POLICY = jax.checkpoint_policies.dots_saveable
LN_EPS = 1e-6
POSEMB_STDDEV = 0.02  # "from BERT", as the original.
REGISTER_STDDEV = 1e-6  # timm's init of its reg_token
MLP_BIAS_STDDEV = 1e-6


def sincos2d_posemb(h: int, w: int, width: int, temperature: float = 10_000.) -> np.ndarray:
  """Fixed MoCo-v3 2-D sin-cos embedding [h*w, width], channels [sin x, cos x, sin y, cos y].

  omega_k = 1 / temperature**(k / (width/4 - 1)), k = 0 .. width/4 - 1; tokens in row-major order.
  """
  if width % 4 or width < 8:
    raise UserError(f"posemb 'sincos2d' needs a hidden size divisible by 4 and >= 8, got {width}:"
                    " use posemb='learned' or another hidden size")
  quarter = width // 4
  omega = 1. / temperature ** (np.arange(quarter) / (quarter - 1))
  y, x = np.mgrid[:h, :w]
  x = x.reshape(-1)[:, None] * omega[None]
  y = y.reshape(-1)[:, None] * omega[None]
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


def drop_path(x: jax.Array, rate: Union[float, jax.Array], rng: jax.Array) -> jax.Array:
  """Stochastic depth: zero whole examples with probability `rate`, scale the rest by 1/(1-rate).

  `rate` may be traced (a scanned layer's rate); rate 1 keeps nothing and gives zeros.
  """
  keep = 1. - rate
  mask = jax.random.bernoulli(rng, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return x * (mask / jnp.maximum(keep, np.finfo(np.float32).tiny)).astype(x.dtype)


TOKENS = ('batch', 'tokens', 'embed')  # logical axes of the token sequence between blocks


def remat_policy(remat: Union[bool, str]):
  """None (no remat) or the jax.checkpoint policy of 'full' / 'dots' / 'gelu' (True = 'full')."""
  key = ('full' if remat else 'none') if isinstance(remat, bool) else remat
  name = REMAT_POLICIES[key]  # a valid key: `_check` checked it
  return None if name is None else getattr(jax.checkpoint_policies, name)


class AddPositionEmbs(nn.Module):
  """Adds the position embedding to tokens [B, N, D] (N includes the cls slot if `has_cls`).

  A learned embedding with `base_grid` (FlexiViT, `model.flexi_grid`) is stored for that grid,
  [1, (1+) bh*bw, D] as the plain one, and its grid rows are resized to `grid` by `resize`
  (models/flexi.py); the cls row is kept (big_vision's FlexiViT has none: zero, see
  vit_jax/formats/npz.py)."""
  kind: str
  grid: Tuple[int, int]
  has_cls: bool
  param_dtype: Dtype = jnp.float32
  base_grid: Optional[Tuple[int, int]] = None
  resize: str = 'bilinear'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.kind == 'learned' and self.base_grid is not None:
      cls = int(self.has_cls)
      pe = self.param('pos_embedding', flexi_lib.initializer(x.shape[2]),
                      (1, cls + self.base_grid[0] * self.base_grid[1], x.shape[2]),
                      self.param_dtype)
      pe = jnp.concatenate([pe[:, :cls], flexi_lib.resize_posemb(
          pe[:, cls:], self.base_grid, self.grid, self.resize)], axis=1)
    elif self.kind == 'learned':
      pe = self.param('pos_embedding', nn.initializers.normal(POSEMB_STDDEV),
                      (1, x.shape[1], x.shape[2]), self.param_dtype)
    else:  # sincos2d: fixed, not a param; the cls slot gets a zero row.
      pe = sincos2d_posemb(*self.grid, x.shape[2])
      if self.has_cls:
        pe = np.concatenate([np.zeros_like(pe[:1]), pe], axis=0)
      pe = jnp.asarray(pe)[None]
    return x + pe.astype(x.dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Self-attention with the flax param layout: query/key/value kernels [D, heads, head_dim],
  biases [heads, head_dim], out kernel [heads, head_dim, D]. Kernels are xavier_uniform on the
  flattened [D, D] matrix (DenseGeneral flattens the shape before calling the initializer).
  `implementation`: the attention kernel (`attention_lib.ATTENTIONS`), resolved when traced."""
  num_heads: int
  dropout_rate: float = 0.
  implementation: str = 'auto'
  fp8: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool,
               kv: Optional[jax.Array] = None) -> jax.Array:
    """Queries from `x`, keys and values from `kv` (default `x`: self-attention)."""
    kv = x if kv is None else kv
    width = x.shape[-1]
    head_dim = width // self.num_heads
    dense = lambda name: nn.DenseGeneral(
        features=(self.num_heads, head_dim), axis=-1,
        kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.zeros, dtype=self.dtype, param_dtype=self.param_dtype,
        dot_general_cls=fp8_lib.dot_general_cls(self.fp8), name=name)
    kernel = attention_lib.resolve(self.implementation, self.dropout_rate, dtype=self.dtype,
                                   head_dim=head_dim)
    if kernel in attention_lib.FUSED:
      q, k, v = dense('query')(x), dense('key')(kv), dense('value')(kv)
      y = attention_lib.FUSED[kernel](q / jnp.sqrt(head_dim).astype(q.dtype), k, v)
    else:
      # Heads-major [B, H, N, hd] for the two attention matmuls: each is then a plain batched
      # matmul over (B, H), with no transposes inside it. Same math and params.
      names = ('batch', 'heads', 'tokens', 'kv')
      q, k, v = (constrain(jnp.swapaxes(dense(n)(y), 1, 2), names)
                 for n, y in (('query', x), ('key', kv), ('value', kv)))
      q = q / jnp.sqrt(head_dim).astype(q.dtype)
      logits = jnp.einsum('bhqd,bhkd->bhqk', q, k)
      weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
      self.sow('intermediates', 'attention_weights', weights)
      weights = nn.Dropout(rate=self.dropout_rate)(weights, deterministic=deterministic)
      y = jnp.swapaxes(constrain(jnp.einsum('bhqk,bhkd->bhqd', weights, v), names), 1, 2)
    out = nn.DenseGeneral(
        features=width, axis=(-2, -1), kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.zeros, dtype=self.dtype, param_dtype=self.param_dtype,
        dot_general_cls=fp8_lib.dot_general_cls(self.fp8), name='out')
    return out(y)


class MlpBlock(nn.Module):
  """Dense_0 -> GELU -> dropout -> Dense_1 -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.
  gelu_approximate: bool = True
  fp8: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    dense = lambda features: nn.Dense(
        features, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(MLP_BIAS_STDDEV), dtype=self.dtype,
        param_dtype=self.param_dtype, dot_general_cls=fp8_lib.dot_general_cls(self.fp8))
    width = x.shape[-1]
    x = nn.gelu(checkpoint_name(dense(self.mlp_dim)(x), MLP_HIDDEN),
                approximate=self.gelu_approximate)
    x = constrain(x, ('batch', 'tokens', 'mlp'))
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = dense(width)(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block; each residual branch may be dropped per example (drop path) with
  probability `drop_path_rate` (None: never; a float, or traced when the blocks are scanned)."""
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  gelu_approximate: bool = True
  attention: str = 'auto'
  recompute_gelu: bool = False
  fp8: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _drop_path(self, y: jax.Array, rate, deterministic: bool) -> jax.Array:
    if deterministic or rate is None or (isinstance(rate, (int, float)) and rate == 0.):
      return y
    return drop_path(y, rate, self.make_rng('dropout'))

  @nn.compact
  def __call__(self, x: jax.Array, drop_path_rate, train: bool) -> jax.Array:
    deterministic = not train
    norm = lambda: nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=self.param_dtype)
    y = norm()(x)
    y = MultiHeadDotProductAttention(
        self.num_heads, self.attention_dropout_rate, self.attention, fp8=self.fp8,
        dtype=self.dtype, param_dtype=self.param_dtype)(y, deterministic=deterministic)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
    x = x + self._drop_path(y, drop_path_rate, deterministic)
    y = norm()(x)
    # remat='gelu': the MLP keeps only its input and the first Dense's output for the backward
    # pass, which recomputes the GELU (the second Dense's input) from it.
    mlp = (nn.remat(MlpBlock, static_argnums=(2,), policy=GELU_REMAT_POLICY)
           if self.recompute_gelu else MlpBlock)
    y = mlp(self.mlp_dim, self.dropout_rate, self.gelu_approximate, fp8=self.fp8,
            dtype=self.dtype, param_dtype=self.param_dtype, name='MlpBlock_0')(y, deterministic)
    return constrain(x + self._drop_path(y, drop_path_rate, deterministic), TOKENS)


class MAPHead(nn.Module):
  """Multihead attention pooling (big_vision's `MAPHead`, timm's `global_pool='map'`): a learned
  probe token attends to the tokens, then a pre-LN MLP with a residual; -> [B, D]."""
  num_heads: int
  mlp_dim: int
  gelu_approximate: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    b, _, d = x.shape
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d), self.param_dtype)
    probe = jnp.broadcast_to(probe.astype(x.dtype), (b, 1, d))
    y = MultiHeadDotProductAttention(self.num_heads, implementation='einsum', dtype=self.dtype,
                                     param_dtype=self.param_dtype)(probe, deterministic=True,
                                                                   kv=x)
    z = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=self.param_dtype)(y)
    y = y + MlpBlock(self.mlp_dim, gelu_approximate=self.gelu_approximate, dtype=self.dtype,
                     param_dtype=self.param_dtype)(z, True)
    return y[:, 0]


def scanned_blocks(block, x: jax.Array, rates: Optional[jax.Array], *,
                   num_layers: int, train: bool) -> jax.Array:
  """The encoder blocks as ONE `nn.scan`ned layer (`model.scan=True`): the block's params (and
  its sown intermediates) are stacked on a leading layer axis [L, ...], so XLA compiles the block
  once instead of L times. `block` is the Encoder1DBlock class (or its nn.remat) bound by partial
  to its options; `rates` are the per-layer drop-path rates [L] (None: no stochastic depth).

  The same function as the unrolled loop, but the dropout rng is split per layer, so dropout and
  drop-path draws differ from the unrolled encoder's (which folds each block's name into the rng).
  """
  body = lambda mdl, carry, rate: (mdl(carry, rate, train), None)
  scan = nn.scan(body, variable_axes={'params': 0, 'intermediates': 0, fp8_lib.COLLECTION: 0},
                 split_rngs={'params': True, 'dropout': True}, length=num_layers)
  return scan(block(name=layout.BLOCK), x, rates)[0]


class Encoder(nn.Module):
  """posemb -> dropout -> `num_layers` blocks (encoderblock_i, or one scanned encoderblock) ->
  encoder_norm."""
  num_layers: int
  mlp_dim: int
  num_heads: int
  posemb: str = 'learned'
  has_cls: bool = True
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  gelu_approximate: bool = True
  remat: Union[bool, str] = 'none'
  attention: str = 'auto'
  scan: bool = False
  fp8: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  posemb_grid: Optional[Tuple[int, int]] = None  # FlexiViT's underlying grid (AddPositionEmbs)
  posemb_resize: str = 'bilinear'

  @nn.compact
  def __call__(self, x: jax.Array, *, grid: Tuple[int, int], train: bool,
               registers: Optional[jax.Array] = None) -> jax.Array:
    """`registers` [1, R, D] go after the cls token once the position embedding is added."""
    if self.posemb != 'none':
      x = AddPositionEmbs(self.posemb, grid, self.has_cls, self.param_dtype,
                          self.posemb_grid, self.posemb_resize, name='posembed_input')(x)
    if registers is not None:
      regs = jnp.broadcast_to(registers.astype(x.dtype), (x.shape[0],) + registers.shape[1:])
      x = jnp.concatenate([x[:, :int(self.has_cls)], regs, x[:, int(self.has_cls):]], axis=1)
    x = constrain(nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train), TOKENS)
    policy = remat_policy(self.remat)
    if self.scan and policy is None:
      policy = SCAN_NO_REMAT_POLICY
    # Call args (x, drop_path_rate, train): the rate is a static float in the loop and a scanned
    # input when scanned, where remat needs no CSE barrier (the scan already prevents it).
    static = () if self.scan else (2,)
    block_cls = (Encoder1DBlock if policy is None else
                 nn.remat(Encoder1DBlock, static_argnums=static + (3,), policy=policy,
                          prevent_cse=not self.scan))
    block = functools.partial(
        block_cls, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate, attention_dropout_rate=self.attention_dropout_rate,
        gelu_approximate=self.gelu_approximate, attention=self.attention,
        recompute_gelu=self.remat == 'gelu', fp8=self.fp8, dtype=self.dtype,
        param_dtype=self.param_dtype)
    rates = [self.stochastic_depth * i / (self.num_layers - 1) if self.num_layers > 1 else 0.
             for i in range(self.num_layers)]
    if self.scan:
      x = scanned_blocks(block, x, jnp.asarray(rates) if self.stochastic_depth else None,
                         num_layers=self.num_layers, train=train)
    else:
      for i in range(self.num_layers):
        x = block(name=f'{layout.BLOCK}_{i}')(x, rates[i], train)
    return nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=self.param_dtype,
                        name='encoder_norm')(x)


class FlexiPatchEmbedding(nn.Module):
  """FlexiViT's patch embedding: a stored `base` x `base` kernel (params `kernel`, `bias` as
  nn.Conv's), PI-resized to `patch` (models/flexi.py) and applied with stride `patch`."""
  features: int
  base: int
  patch: Tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param('kernel', flexi_lib.initializer(self.features),
                        (self.base, self.base, x.shape[-1], self.features), self.param_dtype)
    bias = self.param('bias', nn.initializers.zeros, (self.features,), self.param_dtype)
    kernel = flexi_lib.pi_resize_kernel(kernel, self.patch).astype(self.dtype)
    y = jax.lax.conv_general_dilated(x.astype(self.dtype), kernel, window_strides=self.patch,
                                     padding='VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    return y + bias.astype(self.dtype)


def check_image_size(height: int, width: int, *, patch_size, resnet, hidden_size: int,
                     num_layers: int, **unused) -> None:
  """Raises a UserError unless images of `height` x `width` split into whole patches (hybrids:
  after the ResNet stem's stride). Takes the variant table's entry (`models.decode`), so a config
  is checked before any model or data exists."""
  del unused
  resnet = resnet_lib.as_resnet_config(resnet)
  stride = resnet.stride if resnet is not None else 1
  p = patch_size
  ph, pw = (int(p), int(p)) if isinstance(p, (int, np.integer)) else (int(p[0]), int(p[1]))
  eh, ew = ph * stride, pw * stride
  if height % eh or width % ew:
    size = f'{height}' if height == width else f'{height}x{width}'
    if resnet is None:
      what = f'the patch size {ph if ph == pw else (ph, pw)}'
    else:
      what = (f'{eh if eh == ew else (eh, ew)} (ResNet stride {stride} x patch size '
              f'{ph if ph == pw else (ph, pw)})')
    multiple = eh if eh == ew else f'{eh} (height) and {ew} (width)'
    raise UserError(f'image size {size} is not divisible by {what} of this '
                    f'{"hybrid " if resnet is not None else ""}ViT '
                    f'(hidden {hidden_size}, {num_layers} layers): '
                    f'use a multiple of {multiple}')


class VisionTransformer(nn.Module):
  """ViT classifier: NHWC images in [-1, 1] -> float32 logits [B, num_classes].

  classifier='map' pools by attention (`MAPHead`, params under MAPHead_0), as 'gap' without a
  cls token. With classifier='unpooled' the output is per token, [B, N, num_classes] (N includes cls).
  `resnet` (None, a `ResNetConfig` or a mapping {num_layers, width_factor}) adds the hybrid stem.
  `stochastic_depth` is the drop-path rate of the last block; block i uses rate * i / (L - 1).
  `dtype` is the compute dtype of the stem and encoder; pre_logits and head run in float32.
  """
  num_classes: int
  patch_size: Union[int, Tuple[int, int]]
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  resnet: Optional[Any] = None
  classifier: str = 'token'
  representation_size: Optional[int] = None
  posemb: str = 'learned'
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  head_bias_init: float = 0.
  gelu_approximate: bool = True
  remat: Union[bool, str] = 'none'
  attention: str = 'auto'  # attention kernel: auto | einsum | dot_product | cudnn | flash
  with_mask_token: bool = False  # masked patch prediction: a learnable [mask] patch embedding
  scan: bool = False  # the blocks as one scanned layer, params stacked [L, ...] (see `init`)
  fp8: bool = False  # the encoder's dense layers in fp8 with delayed scaling (models/fp8.py)
  num_registers: int = 0  # register tokens: attended to, never pooled (num_prefix_tokens)
  # FlexiViT (models/flexi.py): the stored patch kernel's side (0: the patch size) and learned
  # position-embedding grid's side (0: the image's token grid), resized to the patch size and
  # token grid at call time; `flexi_resize` interpolates the position embedding.
  flexi_patch: int = 0
  flexi_grid: int = 0
  flexi_resize: str = 'bilinear'

  @nn.nowrap
  def init_with_output(self, rngs, *args, **kwargs):
    """flax's (also behind `init`); a scanned model draws exactly the unrolled model's variables
    (same rngs) and stacks them: `scan` is a compile-time choice that leaves a run's start as is."""
    if not self.scan:
      return super().init_with_output(rngs, *args, **kwargs)
    out, variables = self.clone(scan=False).init_with_output(rngs, *args, **kwargs)
    return out, layout.stack_blocks(variables)

  @nn.nowrap
  def check_image_size(self, height: int, width: int) -> None:
    """`check_image_size` for this model's patches and stem."""
    check_image_size(height, width, patch_size=self.patch, resnet=self.resnet,
                     hidden_size=self.hidden_size, num_layers=self.num_layers)

  @property
  def patch(self) -> Tuple[int, int]:
    p = self.patch_size
    return (int(p), int(p)) if isinstance(p, (int, np.integer)) else (int(p[0]), int(p[1]))

  def _check(self, inputs: jax.Array) -> None:
    """User mistakes (bad option values, shapes) -> one-line UserError."""
    option_values.check_values({k: getattr(self, k) for k in option_values.CHECKED})
    if self.hidden_size % self.num_heads:
      raise UserError(f'hidden_size {self.hidden_size} is not divisible by num_heads '
                      f'{self.num_heads}: use a hidden size that is a multiple of num_heads')
    if inputs.ndim != 4:
      raise UserError(f'expected NHWC images [batch, height, width, channels], got shape '
                      f'{tuple(inputs.shape)}: add the missing batch or channel axis')
    self.check_image_size(*inputs.shape[1:3])

  @nn.compact
  def __call__(self, inputs: jax.Array, *, train: bool, corrupt=None) -> jax.Array:
    """`corrupt` (masked patch prediction only): {'source': int [B, N] patch to take each
    embedding from, 'use_mask': bool [B, N] replace by the mask token}; see vit_jax/tasks/mpp.py."""
    self._check(inputs)
    resnet = resnet_lib.as_resnet_config(self.resnet)
    x = inputs.astype(self.dtype)

    if resnet is not None:
      x = resnet_lib.resnet_stem(x, resnet, self.dtype, self.param_dtype)

    if self.flexi_patch:
      x = FlexiPatchEmbedding(self.hidden_size, self.flexi_patch, self.patch, dtype=self.dtype,
                              param_dtype=self.param_dtype, name='embedding')(x)
    else:
      x = nn.Conv(self.hidden_size, self.patch, strides=self.patch, padding='VALID',
                  kernel_init=nn.initializers.lecun_normal(), dtype=self.dtype,
                  param_dtype=self.param_dtype, name='embedding')(x)
    b, h, w, d = x.shape
    x = jnp.reshape(x, (b, h * w, d))
    if self.with_mask_token:  # masked patch prediction: corrupt the patch embeddings
      mask = self.param('mask_token', nn.initializers.normal(POSEMB_STDDEV), (1, 1, d),
                        self.param_dtype)
      if corrupt is not None:
        x = jnp.take_along_axis(x, corrupt['source'][..., None], axis=1)
        x = jnp.where(corrupt['use_mask'][..., None], mask.astype(x.dtype), x)

    with_cls = has_cls(self.classifier)
    if with_cls:
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (b, 1, d)), x], axis=1)
    registers = None
    if self.num_registers:
      registers = self.param('registers', nn.initializers.normal(REGISTER_STDDEV),
                             (1, self.num_registers, d), self.param_dtype)

    x = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        posemb=self.posemb, has_cls=with_cls, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        stochastic_depth=self.stochastic_depth, gelu_approximate=self.gelu_approximate,
        remat=self.remat, scan=self.scan, attention=self.attention, fp8=self.fp8,
        dtype=self.dtype, param_dtype=self.param_dtype,
        posemb_grid=(self.flexi_grid, self.flexi_grid) if self.flexi_grid else None,
        posemb_resize=self.flexi_resize,
        name='Transformer')(x, grid=(h, w), train=train, registers=registers)

    x = drop_registers(self, x)
    if self.classifier == 'token':
      x = x[:, 0]
    elif self.classifier == 'gap':
      x = jnp.mean(x, axis=1)
    elif self.classifier == 'map':
      x = MAPHead(self.num_heads, self.mlp_dim, self.gelu_approximate, dtype=self.dtype,
                  param_dtype=self.param_dtype)(x)
    # 'unpooled': keep every token but the registers.

    x = x.astype(jnp.float32)
    if self.representation_size is not None:
      x = nn.Dense(self.representation_size, kernel_init=nn.initializers.lecun_normal(),
                   dtype=jnp.float32, param_dtype=self.param_dtype, name='pre_logits')(x)
      x = jnp.tanh(x)
    self.sow('intermediates', 'features', x)
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                    bias_init=nn.initializers.constant(self.head_bias_init), dtype=jnp.float32,
                    param_dtype=self.param_dtype, name='head')(x)


def has_cls(classifier: str) -> bool:
  """Whether a ViT with this classifier has a cls token (the others pool the patch tokens)."""
  return classifier in ('token', 'unpooled')


def num_prefix_tokens(model: VisionTransformer) -> int:
  """Tokens before the patch tokens in the encoder's sequence: the cls token (classifier 'token'
  or 'unpooled') and the registers. Everything that reads tokens skips these (or the registers)."""
  return int(has_cls(model.classifier)) + model.num_registers


def drop_registers(model: VisionTransformer, tokens, axis: int = 1):
  """`tokens` (the encoder's sequence, along `axis`) without the register tokens."""
  if not model.num_registers:
    return tokens
  keep = np.r_[:num_prefix_tokens(model) - model.num_registers,
               num_prefix_tokens(model):tokens.shape[axis]]
  return jnp.take(tokens, keep, axis=axis) if isinstance(tokens, jax.Array) else np.take(
      tokens, keep, axis=axis)


def token_grid(model: VisionTransformer,
               image_size: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
  """The (gh, gw) patch grid of `model` at `image_size` (hybrids: after the ResNet stem)."""
  h, w = (image_size, image_size) if np.isscalar(image_size) else image_size
  resnet = resnet_lib.as_resnet_config(model.resnet)
  stride = resnet.stride if resnet is not None else 1
  ph, pw = model.patch
  return h // (ph * stride), w // (pw * stride)
