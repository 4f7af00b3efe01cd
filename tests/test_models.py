"""Tests of vit_jax.models: variant table, exact param counts, param tree, options, init, numerics.

Big models are only traced (`jax.eval_shape`), never materialised. Expected numbers come from the
original code's `models_test.py` (the paper's Table 1 models).
"""

import contextlib
import functools
import io
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax import ad_checkpoint

from vit_jax.errors import UserError
from vit_jax.models import VARIANTS, VisionTransformer, create_model, decode_variant
from vit_jax.models import resnet as resnet_lib
from vit_jax.models import vit as vit_lib

# ---------------------------------------------------------------------------------------------
# Helpers.


def _abstract_params(name, size=224, num_classes=1000, channels=3, **overrides):
  """Flat {path: ShapeDtypeStruct} of the params, traced only (cached)."""
  return _abstract_params_cached(name, size, num_classes, channels, tuple(sorted(overrides.items())))


@functools.lru_cache(maxsize=None)
def _abstract_params_cached(name, size, num_classes, channels, overrides):
  model = create_model(name, num_classes=num_classes, **dict(overrides))
  x = jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
  return traverse_util.flatten_dict(variables['params'], sep='/')


def _count(name, **kwargs):
  return sum(math.prod(p.shape) for p in _abstract_params(name, **kwargs).values())


def _key(seed):
  # 'rbg' keys: the XLA CPU compile of threefry dominates the runtime of these tiny models.
  return jax.random.key(seed, impl='rbg')


@functools.lru_cache(maxsize=None)
def _images(n=2, size=28, channels=1, seed=0):
  rng = np.random.RandomState(seed)
  return jnp.asarray(rng.uniform(-1., 1., (n, size, size, channels)), jnp.float32)


def _normal(shape, seed=0, dtype=jnp.float32):
  return jnp.asarray(np.random.RandomState(seed).normal(size=shape), dtype)


def _raw_params(name, size=28, channels=1, num_classes=10, **overrides):
  return _raw_params_cached(name, size, channels, num_classes, tuple(sorted(overrides.items())))


@functools.lru_cache(maxsize=None)
def _raw_params_cached(name, size, channels, num_classes, overrides):
  model = create_model(name, num_classes=num_classes, **dict(overrides))
  # Op by op: the compiled ops are shared by all the tiny models of the same shapes.
  return model.init(_key(0), _images(2, size, channels), train=False)['params']


def _params(name, size=28, channels=1, num_classes=10, **overrides):
  """Params of a freshly initialised model, with a random head kernel (the zero-init head would
  hide every other change)."""
  params = jax.tree.map(lambda p: p, _raw_params(name, size, channels, num_classes, **overrides))
  params['head']['kernel'] = _normal(params['head']['kernel'].shape, 1,
                                     params['head']['kernel'].dtype)
  return params


# 'gap' models run on 20x40 images: a 5x10 grid = 50 tokens, the sequence length of the token
# models at 28x28 (7x7 + cls). So they reuse the op-by-op compiled kernels (this file's runtime is
# mostly XLA compiles), and the grid is not square (tests the h/w order of the posemb).
GAP_GRID = (5, 10)


def _gap_images():
  return jnp.asarray(np.random.RandomState(3).uniform(-1., 1., (2, 20, 40, 1)), jnp.float32)


def _gap_params():
  """ViT-Ze/4 'gap' params for 20x40 images, from the token model's: no cls, 5*10 posemb rows."""
  params = _params('ViT-Ze/4')
  del params['cls']
  return params


def _apply(model, params, x, train=False, seed=0, **kwargs):
  rngs = {'dropout': _key(seed)} if train else {}
  return model.apply({'params': params}, x, train=train, rngs=rngs, **kwargs)


# ---------------------------------------------------------------------------------------------
# Exact parameter counts (the original `models_test.py`).

COUNT_224_1K = {
    'ViT-Ti/16': 5_717_416,
    'ViT-S/16': 22_050_664,
    'ViT-S/32': 22_878_952,
    'ViT-B/32': 88_224_232,
    'ViT-B/16': 86_567_656,
    'ViT-B/8': 86_576_872,
    'ViT-L/16': 304_326_632,
    'ViT-L/32': 306_535_400,
    'ViT-H/14': 632_045_800,
    'R+ViT-Ti/16': 6_337_704,
    'R26+ViT-S/32': 36_431_912,
    'R26+ViT-B/32': 101_383_976,
    'R50+ViT-B/16': 98_659_112,
    'R50+ViT-L/32': 328_994_856,
    # Not in `models_test.py`; derived from it: R50 backbone = R50+ViT-L/32 - ViT-L/32 with a
    # [1,1,2048,1024] instead of a [32,32,3,1024] embedding = 23,508,032; then
    # ViT-B/32 - 32*32*3*768 + 2048*768 + 23,508,032 = 110,945,832.
    'R50+ViT-B/32': 110_945_832,
    # Derived the same way: R50 (3,4,9) backbone = R50+ViT-B/16 - ViT-B/16 with a [1,1,1024,768]
    # instead of a [16,16,3,768] embedding = 11,894,848; then
    # ViT-L/16 - 16*16*3*1024 + 1024*1024 + 11,894,848 = 316,483,624.
    'R50+ViT-L/16': 316_483_624,
}

SMALL_VARIANTS = ('ViT-Mu/4', 'ViT-Ze/4', 'R+ViT-Mu/4', 'R+ViT-Ze/4')

REQUIRED_VARIANTS = (
    'ViT-Ti/16', 'ViT-S/16', 'ViT-S/32', 'ViT-B/8', 'ViT-B/16', 'ViT-B/32', 'ViT-L/16', 'ViT-L/32',
    'ViT-H/14', 'R50+ViT-B/16', 'R50+ViT-L/32', 'R26+ViT-S/32', 'R26+ViT-B/32', 'R+ViT-Ti/16',
    'ViT-Mu/4', 'ViT-Ze/4', 'R+ViT-Mu/4', 'R+ViT-Ze/4')


def test_every_registered_variant_is_pinned():
  assert set(REQUIRED_VARIANTS) <= set(VARIANTS)
  assert len(set(VARIANTS)) == len(VARIANTS)
  # BiT counts: tests/test_bit.py; Mixer counts: tests/test_mixer.py.
  vits = {v for v in VARIANTS if not v.startswith(('BiT-', 'Mixer-'))}
  assert vits == set(COUNT_224_1K) | set(SMALL_VARIANTS)


@pytest.mark.parametrize('name', sorted(COUNT_224_1K))
@pytest.mark.slow
def test_param_count_224_1k(name):
  assert _count(name) == COUNT_224_1K[name]


@pytest.mark.parametrize('name,expected', [
    ('ViT-B/16', 86_859_496),
    ('R+ViT-Ti/16', 6_355_944),
])
@pytest.mark.slow
def test_param_count_384_1k(name, expected):
  assert _count(name, size=384) == expected


@pytest.mark.parametrize('name,expected', [
    ('ViT-Ti/16', 9_740_115),
    ('ViT-B/16', 102_595_923),
])
def test_param_count_224_21k(name, expected):
  assert _count(name, num_classes=21843) == expected


def test_param_count_21k_with_pre_logits():
  # The original i21k checkpoints also carry pre_logits: add D*D + D.
  assert _count('ViT-B/32', num_classes=21843, representation_size=768) == (
      104_252_499 + 768 * 768 + 768)


@pytest.mark.parametrize('name,expected', [
    ('ViT-B/16', 86_566_120),
    ('ViT-S/16', 22_049_896),
    ('ViT-S/32', 22_878_184),
])
def test_param_count_gap(name, expected):
  assert _count(name, classifier='gap') == expected


def _formula_count(d, layers, mlp, patch, tokens, channels, classes, cls=True):
  """Independent closed form for a plain ViT (used to pin the small CPU variants)."""
  block = 4 * d + 4 * (d * d + d) + (d * mlp + mlp) + (mlp * d + d)
  return (patch * patch * channels * d + d + (d if cls else 0) + tokens * d + layers * block
          + 2 * d + d * classes + classes)


def test_closed_form_matches_the_table_and_small_variants():
  assert _formula_count(768, 12, 3072, 16, 197, 3, 1000) == COUNT_224_1K['ViT-B/16']
  assert _formula_count(1280, 32, 5120, 14, 257, 3, 1000) == COUNT_224_1K['ViT-H/14']
  # Small bases on 28x28 grayscale: 7x7 grid + cls.
  assert _count('ViT-Mu/4', size=28, channels=1, num_classes=10) == _formula_count(
      64, 6, 256, 4, 50, 1, 10)
  assert _count('ViT-Ze/4', size=28, channels=1, num_classes=10) == _formula_count(
      32, 2, 64, 4, 50, 1, 10)
  # Stem-only hybrids: + conv_root 7x7xCx64 + gn_root (2x64); embedding 1x1x64xD on a 7x7 grid.
  for name, d, layers, mlp in (('R+ViT-Mu/4', 64, 6, 256), ('R+ViT-Ze/4', 32, 2, 64)):
    stem = 7 * 7 * 1 * 64 + 2 * 64
    assert _count(name, size=28, channels=1, num_classes=10) == stem + _formula_count(
        d, layers, mlp, 1, 50, 64, 10)


@pytest.mark.parametrize('name,size,tokens', [
    ('ViT-B/16', 224, 197), ('ViT-B/16', 384, 577), ('ViT-B/8', 224, 785),
    ('ViT-H/14', 224, 257), ('ViT-B/32', 224, 50), ('R+ViT-Ti/16', 224, 50),
    ('R+ViT-Ti/16', 384, 145), ('R50+ViT-B/16', 224, 197), ('R50+ViT-L/32', 224, 50),
    ('R26+ViT-S/32', 224, 50),
])
def test_token_counts(name, size, tokens):
  width = decode_variant(name)['hidden_size']
  params = _abstract_params(name, size=size)
  assert params['Transformer/posembed_input/pos_embedding'].shape == (1, tokens, width)


# ---------------------------------------------------------------------------------------------
# Variant decoding.


def test_decode_variant():
  assert decode_variant('ViT-B/16') == dict(
      patch_size=(16, 16), hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072, resnet=None)
  assert decode_variant('ViT-H/14')['num_heads'] == 16
  assert decode_variant('ViT-L/7')['patch_size'] == (7, 7)  # any integer patch
  assert decode_variant('ViT-Ze/7') == dict(
      patch_size=(7, 7), hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, resnet=None)
  assert decode_variant('ViT-Mu/4') == dict(
      patch_size=(4, 4), hidden_size=64, num_layers=6, num_heads=4, mlp_dim=256, resnet=None)
  hybrid = {
      'R50+ViT-B/16': ((3, 4, 9), 1, 768), 'R50+ViT-L/32': ((3, 4, 6, 3), 1, 1024),
      'R50+ViT-L/16': ((3, 4, 9), 1, 1024),
      'R50+ViT-B/32': ((3, 4, 6, 3), 1, 768), 'R26+ViT-S/32': ((2, 2, 2, 2), 1, 384),
      'R26+ViT-B/32': ((2, 2, 2, 2), 1, 768), 'R+ViT-Ti/16': ((), 8, 192),
      'R+ViT-Mu/4': ((), 1, 64), 'R+ViT-Ze/4': ((), 1, 32)}
  for name, (stages, patch, width) in hybrid.items():
    kw = decode_variant(name)
    assert kw['resnet'] == resnet_lib.ResNetConfig(num_layers=stages, width_factor=1), name
    assert kw['patch_size'] == (patch, patch) and kw['hidden_size'] == width, name


# ---------------------------------------------------------------------------------------------
# Param tree: exactly the official linen names.


def test_param_tree_vit_b16():
  d, mlp, heads = 768, 3072, 12
  expected = {
      'embedding/kernel': (16, 16, 3, d), 'embedding/bias': (d,), 'cls': (1, 1, d),
      'Transformer/posembed_input/pos_embedding': (1, 197, d),
      'Transformer/encoder_norm/scale': (d,), 'Transformer/encoder_norm/bias': (d,),
      'head/kernel': (d, 1000), 'head/bias': (1000,)}
  for i in range(12):
    b = f'Transformer/encoderblock_{i}/'
    for ln in ('LayerNorm_0', 'LayerNorm_1'):
      expected[b + ln + '/scale'] = expected[b + ln + '/bias'] = (d,)
    for proj in ('query', 'key', 'value'):
      expected[b + f'MultiHeadDotProductAttention_0/{proj}/kernel'] = (d, heads, 64)
      expected[b + f'MultiHeadDotProductAttention_0/{proj}/bias'] = (heads, 64)
    expected[b + 'MultiHeadDotProductAttention_0/out/kernel'] = (heads, 64, d)
    expected[b + 'MultiHeadDotProductAttention_0/out/bias'] = (d,)
    expected[b + 'MlpBlock_0/Dense_0/kernel'] = (d, mlp)
    expected[b + 'MlpBlock_0/Dense_0/bias'] = (mlp,)
    expected[b + 'MlpBlock_0/Dense_1/kernel'] = (mlp, d)
    expected[b + 'MlpBlock_0/Dense_1/bias'] = (d,)
  got = {k: v.shape for k, v in _abstract_params('ViT-B/16').items()}
  assert got == expected


def test_param_tree_hybrids():
  params = {k: v.shape for k, v in _abstract_params('R50+ViT-B/16').items()}
  top = {k.split('/')[0] for k in params}
  assert top == {'conv_root', 'gn_root', 'block1', 'block2', 'block3', 'embedding', 'cls',
                 'Transformer', 'head'}
  assert params['conv_root/kernel'] == (7, 7, 3, 64)
  assert 'conv_root/bias' not in params
  assert params['gn_root/scale'] == params['gn_root/bias'] == (64,)
  assert params['block1/unit1/conv1/kernel'] == (1, 1, 64, 64)
  assert params['block1/unit1/conv2/kernel'] == (3, 3, 64, 64)
  assert params['block1/unit1/conv3/kernel'] == (1, 1, 64, 256)
  assert params['block1/unit1/conv_proj/kernel'] == (1, 1, 64, 256)
  assert params['block1/unit1/gn_proj/scale'] == (256,)
  assert params['block1/unit1/gn3/scale'] == (256,)
  assert 'block1/unit2/conv_proj/kernel' not in params
  assert params['block2/unit1/conv_proj/kernel'] == (1, 1, 256, 512)
  assert params['block2/unit4/conv2/kernel'] == (3, 3, 128, 128)
  assert params['block3/unit9/conv3/kernel'] == (1, 1, 256, 1024)
  assert 'block3/unit10/conv1/kernel' not in params
  assert params['embedding/kernel'] == (1, 1, 1024, 768)
  l32 = _abstract_params('R50+ViT-L/32')
  assert l32['block4/unit3/conv3/kernel'].shape == (1, 1, 512, 2048)
  assert l32['embedding/kernel'].shape == (1, 1, 2048, 1024)
  ti = _abstract_params('R+ViT-Ti/16')
  assert not any(k.startswith('block') for k in ti)
  assert ti['embedding/kernel'].shape == (8, 8, 64, 192)


# ---------------------------------------------------------------------------------------------
# Forward pass of the tiny models.


@pytest.mark.parametrize('name', ['ViT-Ze/4', 'R+ViT-Ze/4'])
def test_forward_tiny(name):
  model = create_model(name, num_classes=10)
  x = _images()
  logits = _apply(model, _params(name), x)
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  # The two examples get different logits (the head kernel is random here).
  assert not np.allclose(logits[0], logits[1])
  # RGB input (traced only: the same graph apart from the embedding's input channels).
  x3 = jax.ShapeDtypeStruct((2, 28, 28, 3), jnp.float32)
  out, variables = jax.eval_shape(
      lambda x: model.init_with_output(_key(0), x, train=False), x3)
  assert out.shape == (2, 10) and out.dtype == jnp.float32
  kernel = variables['params']['conv_root' if name.startswith('R+') else 'embedding']['kernel']
  assert kernel.shape[2] == 3


def test_zero_head_gives_bias_logits():
  model = create_model('ViT-Ze/4', num_classes=10, head_bias_init=-6.9)
  params = _raw_params('ViT-Ze/4', head_bias_init=-6.9)
  np.testing.assert_array_equal(params['head']['bias'], np.full((10,), -6.9, np.float32))
  assert np.all(np.asarray(_raw_params('ViT-Ze/4')['head']['bias']) == 0)
  np.testing.assert_allclose(_apply(model, params, _images()), -6.9, rtol=0, atol=1e-6)


def _np_layer_norm(x, p, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _np_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _np_same_pad(size, k, s):
  out = -(-size // s)
  total = max((out - 1) * s + k - size, 0)
  return total // 2, total - total // 2


def _np_stem(x, params):
  """conv_root (7x7/2 'SAME', weight-standardised) -> GroupNorm(32) -> relu -> max-pool 3x3/2."""
  w = np.asarray(params['conv_root']['kernel'], np.float64)
  w = (w - w.mean((0, 1, 2))) / (w.std((0, 1, 2)) + 1e-5)
  lo, hi = _np_same_pad(x.shape[1], 7, 2)
  xp = np.pad(x, ((0, 0), (lo, hi), (lo, hi), (0, 0)))
  n = -(-x.shape[1] // 2)
  y = sum(xp[:, i:i + 2 * n:2, j:j + 2 * n:2, :] @ w[i, j] for i in range(7) for j in range(7))
  y = _group_norm_reference(y) * params['gn_root']['scale'] + params['gn_root']['bias']
  y = np.maximum(y, 0)
  lo, hi = _np_same_pad(n, 3, 2)
  yp = np.pad(y, ((0, 0), (lo, hi), (lo, hi), (0, 0)), constant_values=-np.inf)
  m = -(-n // 2)
  return np.max([yp[:, i:i + 2 * m:2, j:j + 2 * m:2, :] for i in range(3) for j in range(3)], 0)


def _np_vit(params, x, patch, heads):
  """Independent numpy forward of a token-classifier ViT (learned posemb, eval mode)."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
  x = np.asarray(x, np.float64)
  if 'conv_root' in params:
    x = _np_stem(x, params)
  b, h, w, c = x.shape
  g = h // patch
  x = x.reshape(b, g, patch, g, patch, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * g, -1)
  x = x @ params['embedding']['kernel'].reshape(-1, params['embedding']['kernel'].shape[-1])
  x = x + params['embedding']['bias']
  x = np.concatenate([np.broadcast_to(params['cls'], (b, 1, x.shape[-1])), x], axis=1)
  t = params['Transformer']
  x = x + t['posembed_input']['pos_embedding']
  i = 0
  while f'encoderblock_{i}' in t:
    blk = t[f'encoderblock_{i}']
    a = blk['MultiHeadDotProductAttention_0']
    y = _np_layer_norm(x, blk['LayerNorm_0'])
    q, k, v = (np.einsum('bnd,dhe->bnhe', y, a[n]['kernel']) + a[n]['bias']
               for n in ('query', 'key', 'value'))
    logits = np.einsum('bqhe,bkhe->bhqk', q, k) / math.sqrt(q.shape[-1])
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    y = np.einsum('bhqk,bkhe->bqhe', att, v)
    x = x + np.einsum('bqhe,hed->bqd', y, a['out']['kernel']) + a['out']['bias']
    y = _np_layer_norm(x, blk['LayerNorm_1'])
    m = blk['MlpBlock_0']
    y = _np_gelu_tanh(y @ m['Dense_0']['kernel'] + m['Dense_0']['bias'])
    x = x + y @ m['Dense_1']['kernel'] + m['Dense_1']['bias']
    i += 1
  x = _np_layer_norm(x, t['encoder_norm'])[:, 0]
  return x @ params['head']['kernel'] + params['head']['bias']


@pytest.mark.parametrize('name,patch', [('ViT-Ze/4', 4), ('R+ViT-Ze/4', 1)])
def test_forward_matches_numpy_reference(name, patch):
  params = _params(name)
  # Non-trivial LayerNorm / GroupNorm / cls params, so that each one matters.
  params = jax.tree.map(lambda p: p + 0.1 * _normal(p.shape, seed=p.size) if p.ndim == 1 else p,
                        params)
  params['cls'] = _normal((1, 1, 32), seed=5)
  x = _images()
  out = _apply(create_model(name, num_classes=10), params, x)
  np.testing.assert_allclose(out, _np_vit(params, x, patch, heads=2), rtol=2e-4, atol=2e-4)


def test_norm_epsilons():
  seen = []

  def record(module, method_name):
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
      seen.append((type(module).__name__, module.epsilon, getattr(module, 'num_groups', None)))
    return False
  _apply(create_model('R+ViT-Ze/4', num_classes=10), _params('R+ViT-Ze/4'), _images(),
         capture_intermediates=record)
  assert sorted(set(seen)) == [('GroupNorm', 1e-6, 32), ('LayerNorm', 1e-6, None)]
  assert len(seen) == 1 + 2 * 2 + 1  # gn_root, 2 per block, encoder_norm


# ---------------------------------------------------------------------------------------------
# Options.


def test_classifier_options():
  x = _images()
  model = {c: create_model('ViT-Ze/4', num_classes=10, classifier=c)
           for c in ('token', 'gap', 'unpooled')}
  token, gap = _params('ViT-Ze/4'), _gap_params()
  x_gap = _gap_images()
  keys = {c: set(_abstract_params('ViT-Ze/4', size=28, num_classes=10, channels=1, classifier=c))
          for c in ('token', 'gap', 'unpooled')}
  assert keys['token'] == keys['unpooled'] == keys['gap'] | {'cls'}
  assert set(traverse_util.flatten_dict(gap, sep='/')) == keys['gap']
  assert _abstract_params('ViT-Ze/4', size=28, num_classes=10, channels=1, classifier='gap')[
      'Transformer/posembed_input/pos_embedding'].shape == (1, 49, 32)
  assert token['Transformer']['posembed_input']['pos_embedding'].shape == (1, 50, 32)
  out_token = _apply(model['token'], token, x)
  out_gap = _apply(model['gap'], gap, x_gap)
  unpooled, state = _apply(model['unpooled'], token, x, capture_intermediates=True)
  assert out_token.shape == out_gap.shape == (2, 10)
  assert unpooled.shape == (2, 50, 10)
  # Same params: the token logits are the cls row of the unpooled ones ...
  np.testing.assert_allclose(out_token, unpooled[:, 0], rtol=1e-5, atol=1e-5)
  # ... and every row is the head applied to that token after encoder_norm.
  feats = state['intermediates']['Transformer']['__call__'][0]
  np.testing.assert_allclose(unpooled, feats @ token['head']['kernel'] + token['head']['bias'],
                             rtol=1e-5, atol=1e-5)
  # gap: the head applied to the mean token.
  _, state = _apply(model['gap'], gap, x_gap, capture_intermediates=True)
  feats = state['intermediates']['Transformer']['__call__'][0]
  assert feats.shape == (2, 50, 32)
  np.testing.assert_allclose(out_gap, feats.mean(1) @ gap['head']['kernel'] + gap['head']['bias'],
                             rtol=1e-5, atol=1e-5)


def test_representation_size_adds_pre_logits():
  x = _images()
  rep = create_model('ViT-Ze/4', num_classes=10, representation_size=16)
  shapes = _abstract_params('ViT-Ze/4', size=28, num_classes=10, channels=1, representation_size=16)
  assert {k: v.shape for k, v in shapes.items() if k.split('/')[0] in ('pre_logits', 'head')} == {
      'pre_logits/kernel': (32, 16), 'pre_logits/bias': (16,),
      'head/kernel': (16, 10), 'head/bias': (10,)}
  assert set(shapes) - set(_abstract_params('ViT-Ze/4', size=28, num_classes=10, channels=1)) == {
      'pre_logits/kernel', 'pre_logits/bias'}
  p_rep = _params('ViT-Ze/4')
  p_rep['pre_logits'] = {'kernel': _normal((32, 16), 7), 'bias': _normal((16,), 8)}
  p_rep['head'] = {'kernel': _normal((16, 10), 9), 'bias': _normal((10,), 10)}
  # pre_logits is tanh(Dense(features)): reproduce the logits from the captured features.
  logits, state = _apply(rep, p_rep, x, capture_intermediates=True)
  feats = state['intermediates']['Transformer']['__call__'][0][:, 0]
  pre = jnp.tanh(feats @ p_rep['pre_logits']['kernel'] + p_rep['pre_logits']['bias'])
  np.testing.assert_allclose(logits, pre @ p_rep['head']['kernel'] + p_rep['head']['bias'],
                             rtol=1e-5, atol=1e-5)


def _sincos_reference(h, w, width):
  """Element by element, straight from the formula of big_vision's `posemb_sincos_2d`."""
  q = width // 4
  out = np.zeros((h * w, width))
  for row in range(h):
    for col in range(w):
      t = row * w + col
      for k in range(q):
        omega = 1.0 / 10000 ** (k / (q - 1))
        out[t, k] = math.sin(col * omega)
        out[t, q + k] = math.cos(col * omega)
        out[t, 2 * q + k] = math.sin(row * omega)
        out[t, 3 * q + k] = math.cos(row * omega)
  return out


def test_sincos2d_values():
  np.testing.assert_allclose(vit_lib.sincos2d_posemb(3, 5, 16), _sincos_reference(3, 5, 16),
                             rtol=1e-6, atol=1e-6)


def _without_posemb(params):
  params = jax.tree.map(lambda p: p, params)
  del params['Transformer']['posembed_input']
  return params


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_posemb_options(classifier):
  x = _images() if classifier == 'token' else _gap_images()
  models = {kind: create_model('ViT-Ze/4', num_classes=10, posemb=kind, classifier=classifier)
            for kind in ('learned', 'sincos2d', 'none')}
  learned = _params('ViT-Ze/4') if classifier == 'token' else _gap_params()
  flat_learned = traverse_util.flatten_dict(learned, sep='/')
  for kind in ('sincos2d', 'none'):
    flat = _abstract_params('ViT-Ze/4', size=28, num_classes=10, channels=1,
                            classifier=classifier, posemb=kind)
    # The same params as the learned model minus pos_embedding.
    assert set(flat) == set(flat_learned) - {'Transformer/posembed_input/pos_embedding'}, kind
  params = _without_posemb(learned)
  out_none = _apply(models['none'], params, x)
  out_sincos = _apply(models['sincos2d'], params, x)
  assert not np.allclose(out_none, out_sincos)
  # sincos2d == a learned posemb set to the sincos table (zero row for cls, added after cls).
  table = _sincos_reference(7, 7, 32) if classifier == 'token' else _sincos_reference(*GAP_GRID, 32)
  if classifier == 'token':
    table = np.concatenate([np.zeros((1, 32)), table])
  learned_sincos = jax.tree.map(lambda p: p, learned)
  learned_sincos['Transformer']['posembed_input']['pos_embedding'] = jnp.asarray(
      table[None], jnp.float32)
  np.testing.assert_allclose(_apply(models['learned'], learned_sincos, x), out_sincos,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('option', ['dropout_rate', 'attention_dropout_rate', 'stochastic_depth'])
def test_stochastic_options(option):
  x = _images()
  same = jnp.concatenate([x[:1], x[:1]])  # two copies of one image
  base = create_model('ViT-Ze/4', num_classes=10)
  model = create_model('ViT-Ze/4', num_classes=10, **{option: 0.4})
  params = _params('ViT-Ze/4')
  eval_out = _apply(base, params, same)
  np.testing.assert_allclose(eval_out[0], eval_out[1])
  np.testing.assert_array_equal(_apply(model, params, same, train=False), eval_out)
  np.testing.assert_array_equal(_apply(base, params, same, train=True, seed=1), eval_out)
  outs = [_apply(model, params, same, train=True, seed=seed) for seed in (1, 2, 3)]
  # Different rngs -> different outputs (drop path has few coin flips: compare 3 seeds).
  assert not (np.allclose(outs[0], outs[1]) and np.allclose(outs[0], outs[2]))
  assert not all(np.allclose(o, eval_out) for o in outs)
  # The masks are drawn per example: the two copies get different outputs.
  assert any(not np.allclose(o[0], o[1]) for o in outs)
  # Same rng, same output.
  np.testing.assert_array_equal(outs[0], _apply(model, params, same, train=True, seed=1))


def test_drop_path():
  x = jnp.ones((2000, 3, 4))
  out = np.asarray(vit_lib.drop_path(x, 0.25, _key(0)))
  per_example = out.reshape(2000, -1)
  # Whole examples are either dropped or kept and scaled by 1 / (1 - rate).
  assert np.all((per_example == 0).all(1) | np.isclose(per_example, 1 / 0.75).all(1))
  assert abs((per_example[:, 0] == 0).mean() - 0.25) < 0.04
  assert np.all(np.asarray(vit_lib.drop_path(x, 1.0, _key(0))) == 0)


def test_stochastic_depth_is_linear_in_depth():
  # Rate 1.0 over 2 layers: layer 0 gets 0 (kept), layer 1 gets 1.0 (both branches dropped), so
  # the training output == a 1-layer model with the same params, whatever the rng.
  x = _images()
  two = create_model('ViT-Ze/4', num_classes=10, stochastic_depth=1.0)
  one = create_model('ViT-Ze/4', num_classes=10, num_layers=1)
  params = _params('ViT-Ze/4')
  params_one = jax.tree.map(lambda p: p, params)
  del params_one['Transformer']['encoderblock_1']
  expected = _apply(one, params_one, x)
  for seed in (0, 1):
    np.testing.assert_allclose(_apply(two, params, x, train=True, seed=seed), expected,
                               rtol=1e-6, atol=1e-6)
  assert not np.allclose(_apply(two, params, x), expected)


def test_dtype_bfloat16():
  x = _images()
  model = create_model('ViT-Ze/4', num_classes=10, dtype='bfloat16')
  assert model.dtype == jnp.bfloat16
  abstract = jax.eval_shape(lambda: model.init(_key(0), x, train=False)['params'])
  assert {p.dtype for p in jax.tree.leaves(abstract)} == {jnp.dtype(jnp.float32)}
  params = _params('ViT-Ze/4')  # the same init as the float32 model
  logits, state = jax.jit(lambda p: _apply(model, p, x, capture_intermediates=True,
                                           mutable=['intermediates']))(params)
  assert logits.dtype == jnp.float32
  inter = state['intermediates']
  block = inter['Transformer']['encoderblock_0']
  assert block['MlpBlock_0']['Dense_0']['__call__'][0].dtype == jnp.bfloat16
  assert block['MultiHeadDotProductAttention_0']['query']['__call__'][0].dtype == jnp.bfloat16
  assert block['MultiHeadDotProductAttention_0']['attention_weights'][0].dtype == jnp.bfloat16
  assert inter['embedding']['__call__'][0].dtype == jnp.bfloat16
  assert inter['Transformer']['__call__'][0].dtype == jnp.bfloat16
  # Close to the float32 model with the same params.
  f32 = create_model('ViT-Ze/4', num_classes=10)
  ref = _apply(f32, params, x)
  assert not np.array_equal(logits, ref)
  np.testing.assert_allclose(logits, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())


def test_dtype_bfloat16_hybrid():
  model = create_model('R+ViT-Ze/4', num_classes=10, dtype=jnp.bfloat16)
  x = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
  logits, state = jax.eval_shape(lambda x: model.init_with_output(
      _key(0), x, train=False, capture_intermediates=True, mutable=['params', 'intermediates']),
      x)
  assert logits.dtype == jnp.float32
  for name in ('conv_root', 'gn_root', 'embedding'):
    assert state['intermediates'][name]['__call__'][0].dtype == jnp.bfloat16, name
  assert {p.dtype for p in jax.tree.leaves(state['params'])} == {jnp.dtype(jnp.float32)}


def test_param_dtype():
  model = create_model('R+ViT-Ze/4', num_classes=10, param_dtype=jnp.bfloat16)
  x = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
  logits, variables = jax.eval_shape(
      lambda x: model.init_with_output(_key(0), x, train=False), x)
  assert {p.dtype for p in jax.tree.leaves(variables['params'])} == {jnp.dtype(jnp.bfloat16)}
  assert logits.shape == (2, 10)


def test_gelu_exact_vs_tanh():
  x = _images()
  tanh = create_model('ViT-Ze/4', num_classes=10)
  exact = create_model('ViT-Ze/4', num_classes=10, gelu_approximate=False)
  assert tanh.gelu_approximate is True
  params = _params('ViT-Ze/4')
  diff = np.abs(np.asarray(_apply(tanh, params, x) - _apply(exact, params, x))).max()
  assert 0 < diff < 1e-2


def test_remat():
  x = _images()
  plain = create_model('ViT-Ze/4', num_classes=10, dropout_rate=0.1)
  remat = create_model('ViT-Ze/4', num_classes=10, dropout_rate=0.1, remat=True)
  params = _params('ViT-Ze/4')
  out, variables = jax.eval_shape(lambda: remat.init_with_output(_key(0), x, train=False))
  assert out.shape == (2, 10)
  assert jax.tree.structure(params) == jax.tree.structure(variables['params'])

  def grad_jaxpr(model):
    loss = lambda p: jnp.sum(_apply(model, p, x, train=True, seed=3))
    return str(jax.make_jaxpr(jax.grad(loss))(params))
  # The blocks are rematerialised (a checkpoint/remat primitive in the backward graph).
  remat_jaxpr, plain_jaxpr = grad_jaxpr(remat), grad_jaxpr(plain)
  assert 'remat' in remat_jaxpr or 'checkpoint' in remat_jaxpr
  assert 'remat' not in plain_jaxpr and 'checkpoint' not in plain_jaxpr


# ---------------------------------------------------------------------------------------------
# Initialisation (the original `models_vit.py`).


def test_init_statistics_vit():
  params = _raw_params('ViT-Ze/4')
  d, heads, mlp = 32, 2, 64
  assert np.all(np.asarray(params['cls']) == 0)
  assert np.all(np.asarray(params['head']['kernel']) == 0)
  assert np.all(np.asarray(params['head']['bias']) == 0)
  pe = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  assert pe.shape == (1, 50, d)
  assert abs(pe.std() - 0.02) < 0.0015 and abs(pe.mean()) < 0.002  # 1600 samples
  blocks = [params['Transformer'][f'encoderblock_{i}'] for i in range(2)]
  biases = np.concatenate([np.asarray(b['MlpBlock_0'][n]['bias']) for b in blocks
                           for n in ('Dense_0', 'Dense_1')])
  assert biases.size == 2 * (mlp + d) and 0.8e-6 < biases.std() < 1.2e-6
  for block in blocks:
    # MLP kernels: xavier_uniform, limit sqrt(6 / (fan_in + fan_out)).
    limit = math.sqrt(6 / (d + mlp))
    for name in ('Dense_0', 'Dense_1'):
      assert 0.97 * limit < np.abs(np.asarray(block['MlpBlock_0'][name]['kernel'])).max() <= limit
    # q/k/v/out: xavier_uniform on the flattened [D, D] matrix: limit sqrt(6 / 2D) = sqrt(3 / D)
    # (not on [D, heads, head_dim] as 3-D, which would give sqrt(6 / (D * (heads + head_dim)))).
    attn = block['MultiHeadDotProductAttention_0']
    limit = math.sqrt(3 / d)
    for proj in ('query', 'key', 'value', 'out'):
      w = np.asarray(attn[proj]['kernel'])
      assert w.shape == ((d, heads, d // heads) if proj != 'out' else (heads, d // heads, d))
      assert 0.98 * limit < np.abs(w).max() <= limit, proj
      assert abs(w.std() - limit / math.sqrt(3)) < 0.01, proj
      assert np.all(np.asarray(attn[proj]['bias']) == 0), proj
    for ln in ('LayerNorm_0', 'LayerNorm_1'):
      assert np.all(np.asarray(block[ln]['scale']) == 1)
      assert np.all(np.asarray(block[ln]['bias']) == 0)
  for ln in ('scale', 'bias'):
    assert np.all(np.asarray(params['Transformer']['encoder_norm'][ln]) == (ln == 'scale'))
  # Patch embedding: flax default lecun_normal (truncated normal, fan_in = 4*4*1).
  emb = np.asarray(params['embedding']['kernel'])
  assert abs(emb.std() - 1 / math.sqrt(4 * 4 * 1)) < 0.025  # 512 samples
  assert np.all(np.asarray(params['embedding']['bias']) == 0)


def test_resnet_override_structure():
  # A 2-stage hybrid on 32 px (stride 8 = root conv 2 x max-pool 2 x stage 2).
  params = _abstract_params('R+ViT-Ze/4', size=32, num_classes=10, channels=1,
                            resnet=resnet_lib.ResNetConfig(num_layers=(2, 1)))
  assert params['block1/unit1/conv_proj/kernel'].shape == (1, 1, 64, 256)
  assert 'block1/unit2/conv_proj/kernel' not in params
  assert params['block1/unit2/gn3/scale'].shape == (256,)
  assert params['block2/unit1/conv2/kernel'].shape == (3, 3, 128, 128)
  assert params['embedding/kernel'].shape == (1, 1, 512, 32)
  assert params['Transformer/posembed_input/pos_embedding'].shape == (1, 4 * 4 + 1, 32)
  # A mapping works as well as a ResNetConfig.
  model = create_model('R+ViT-Ze/4', num_classes=10, resnet=dict(num_layers=(2, 1)))
  assert model.resnet == resnet_lib.ResNetConfig(num_layers=(2, 1), width_factor=1)


# ---------------------------------------------------------------------------------------------
# ResNet numerics.


def test_weight_standardisation_matches_numpy():
  w = np.asarray(_normal((3, 3, 4, 5))) * 0.01 + 0.003  # conv-weight scale: eps placement matters
  ref = np.empty_like(w)
  for o in range(5):
    c = w[..., o]
    ref[..., o] = (c - c.mean()) / (np.sqrt(((c - c.mean()) ** 2).mean()) + 1e-5)
  np.testing.assert_allclose(resnet_lib.weight_standardize(jnp.asarray(w)), ref, rtol=1e-5,
                             atol=1e-5)


def test_std_conv_is_conv_with_standardised_kernel():
  x = _normal((2, 9, 9, 4), seed=1)
  conv = resnet_lib.StdConv(5, (3, 3), (2, 2))
  params = {'kernel': _normal((3, 3, 4, 5), seed=2) * 0.5 + 0.2}
  assert set(jax.eval_shape(lambda: conv.init(_key(0), x))['params']) == {'kernel'}  # no bias
  w = np.asarray(params['kernel'])
  ws = (w - w.mean(axis=(0, 1, 2))) / (w.std(axis=(0, 1, 2)) + 1e-5)
  ref = nn.Conv(5, (3, 3), (2, 2), padding='SAME', use_bias=False).apply(
      {'params': {'kernel': jnp.asarray(ws)}}, x)
  out = conv.apply({'params': params}, x)
  assert out.shape == (2, 5, 5, 5)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('padding', ['SAME', ((0, 0), (0, 0))])
def test_pointwise_std_conv_is_the_convolution_with_its_gradients(padding):
  """A 1x1 stride-1 StdConv runs as a matmul over the channels (its kernel gradient then needs no
  channels-first copy of the input on CPU); values and both gradients equal the convolution's."""
  x = _normal((2, 6, 6, 8), seed=3)
  params = {'kernel': _normal((1, 1, 8, 16), seed=4) * 0.5 + 0.1}
  conv = resnet_lib.StdConv(16, (1, 1), padding=padding)

  def by_conv(x, kernel):
    w = resnet_lib.weight_standardize(kernel)
    return jax.lax.conv_general_dilated(x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO',
                                                                                 'NHWC'))

  def loss(fn):
    return lambda x, kernel: jnp.sum(jnp.sin(fn(x, kernel)))

  ours = lambda x, kernel: conv.apply({'params': {'kernel': kernel}}, x)
  assert 'conv_general_dilated' not in str(jax.make_jaxpr(ours)(x, params['kernel']))
  np.testing.assert_allclose(ours(x, params['kernel']), by_conv(x, params['kernel']), rtol=1e-5,
                             atol=1e-5)
  got = jax.grad(loss(ours), argnums=(0, 1))(x, params['kernel'])
  want = jax.grad(loss(by_conv), argnums=(0, 1))(x, params['kernel'])
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  # Strided or larger kernels stay convolutions.
  strided = resnet_lib.StdConv(16, (1, 1), (2, 2))
  assert 'conv_general_dilated' in str(jax.make_jaxpr(
      lambda x: strided.apply({'params': params}, x))(x))


def _group_norm_reference(x, groups=32, eps=1e-6):
  n, h, w, c = x.shape
  g = x.reshape(n, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = g.var(axis=(1, 2, 4), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)


def _np_conv_same(x, w, stride):
  """TF/flax 'SAME' convolution, NHWC x HWIO, in numpy."""
  kh, kw = w.shape[:2]
  (t, b), (l, r) = _np_same_pad(x.shape[1], kh, stride), _np_same_pad(x.shape[2], kw, stride)
  xp = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)))
  oh, ow = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
  return sum(xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :] @ w[i, j]
             for i in range(kh) for j in range(kw))


def _np_std_conv(x, w, stride=1):
  w = (w - w.mean((0, 1, 2))) / (w.std((0, 1, 2)) + 1e-5)
  return _np_conv_same(x, w, stride)


def _np_residual_unit(x, p, stride):
  gn = lambda y, q: _group_norm_reference(y) * q['scale'] + q['bias']
  y = np.maximum(gn(_np_std_conv(x, p['conv1']['kernel']), p['gn1']), 0)
  y = np.maximum(gn(_np_std_conv(y, p['conv2']['kernel'], stride), p['gn2']), 0)
  y = gn(_np_std_conv(y, p['conv3']['kernel']), p['gn3'])
  shortcut = x
  if 'conv_proj' in p:
    shortcut = gn(_np_std_conv(x, p['conv_proj']['kernel'], stride), p['gn_proj'])
  return np.maximum(y + shortcut, 0)


def test_residual_unit():
  x = np.asarray(_normal((1, 5, 5, 64), seed=1))
  unit = resnet_lib.ResidualUnit(32, (2, 2))
  abstract = jax.eval_shape(lambda: unit.init(_key(0), x))['params']
  shapes = {k: v.shape for k, v in traverse_util.flatten_dict(abstract, sep='/').items()}
  assert shapes == {
      'conv1/kernel': (1, 1, 64, 32), 'gn1/scale': (32,), 'gn1/bias': (32,),
      'conv2/kernel': (3, 3, 32, 32), 'gn2/scale': (32,), 'gn2/bias': (32,),
      'conv3/kernel': (1, 1, 32, 128), 'gn3/scale': (128,), 'gn3/bias': (128,),
      'conv_proj/kernel': (1, 1, 64, 128), 'gn_proj/scale': (128,), 'gn_proj/bias': (128,)}
  # Init: gn3 scale 0 (the unit starts as its shortcut), the other GroupNorms scale 1, bias 0.
  gns = jax.jit(lambda: {k: v for k, v in unit.init(_key(0), x)['params'].items()
                         if k.startswith('gn')})()
  assert np.all(np.asarray(gns['gn3']['scale']) == 0)
  for name in ('gn1', 'gn2', 'gn_proj'):
    assert np.all(np.asarray(gns[name]['scale']) == 1) and np.all(np.asarray(gns[name]['bias']) == 0)
  # Forward with random params (odd input size: asymmetric 'SAME' padding) vs numpy.
  params = jax.tree.map(lambda p: np.asarray(_normal(p.shape, seed=p.size)) * 0.5 + 0.1, abstract)
  out = jax.jit(lambda p, x: unit.apply({'params': p}, x))(params, x)
  assert out.shape == (1, 3, 3, 128)
  np.testing.assert_allclose(out, _np_residual_unit(x.astype(np.float64), params, 2),
                             rtol=1e-4, atol=1e-4)
  # Identity shortcut when the shapes match.
  x128 = jax.ShapeDtypeStruct((1, 4, 4, 128), jnp.float32)
  same = jax.eval_shape(lambda x: resnet_lib.ResidualUnit(32).init(_key(0), x), x128)['params']
  assert 'conv_proj' not in same and 'gn_proj' not in same


# ---------------------------------------------------------------------------------------------
# Attention weights.


@pytest.mark.parametrize('name', ['ViT-Ze/4', 'R+ViT-Ze/4'])
def test_attention_weights_are_sown(name):
  x = _images()
  model = create_model(name, num_classes=10)
  params = _params(name)
  plain = model.apply({'params': params}, x, train=False)
  logits, state = model.apply({'params': params}, x, train=False, mutable=['intermediates'])
  np.testing.assert_array_equal(plain, logits)
  blocks = state['intermediates']['Transformer']
  assert sorted(blocks) == ['encoderblock_0', 'encoderblock_1']
  for block in blocks.values():
    (w,) = block['MultiHeadDotProductAttention_0']['attention_weights']
    assert w.shape == (2, 2, 50, 50)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1., rtol=1e-5)
    assert np.all(np.asarray(w) >= 0)


def test_attention_matches_flax_reference():
  x = _normal((2, 50, 32))  # the shapes of ViT-Ze/4 at 28 px
  ours = vit_lib.MultiHeadDotProductAttention(num_heads=2)
  shapes = jax.eval_shape(lambda: ours.init(_key(0), x, deterministic=True))['params']
  # Random kernels and biases, so every param is exercised.
  params = jax.tree.map(lambda p: 0.3 * _normal(p.shape, seed=sum(p.shape)), shapes)
  ref = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=32, out_features=32)
  np.testing.assert_allclose(ours.apply({'params': params}, x, deterministic=True),
                             ref.apply({'params': params}, x, x, deterministic=True),
                             rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# User errors: one line that says how to fix it.


def _one_line(err):
  message = str(err.value)
  assert '\n' not in message
  return message


def test_unknown_variant():
  for bad in ('ViT-Q/16', 'ViT-B', 'B/16', 'R50+ViT-S/16', 'ViT-B/0'):
    with pytest.raises(UserError) as err:
      create_model(bad, num_classes=10)
    message = _one_line(err)
    assert repr(bad) in message
    assert 'Ti,S,B,L,H,Mu,Ze' in message
    for name in REQUIRED_VARIANTS:
      assert name in message
  with pytest.raises(UserError):
    decode_variant('ViT-Q/16')


def test_indivisible_image_size():
  with pytest.raises(UserError) as err:
    create_model('ViT-Ze/4', num_classes=10).init(_key(0), jnp.zeros((1, 30, 30, 1)),
                                                  train=False)
  message = _one_line(err)
  assert 'image size 30' in message and 'patch size 4' in message
  assert message.endswith('use a multiple of 4')
  # Hybrid: stem stride 4 x patch 8 = 32 (traced only).
  model = create_model('R+ViT-Ti/16', num_classes=10)
  with pytest.raises(UserError) as err:
    jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False),
                   jax.ShapeDtypeStruct((1, 208, 208, 3), jnp.float32))
  message = _one_line(err)
  assert 'image size 208' in message and message.endswith('use a multiple of 32')
  # 28 is fine for the stem-only Ze hybrid (stride 4 x patch 1), 30 is not.
  with pytest.raises(UserError):
    create_model('R+ViT-Ze/4', num_classes=10).init(_key(0),
                                                    jnp.zeros((1, 30, 30, 1)), train=False)


def test_unknown_override():
  with pytest.raises(UserError) as err:
    create_model('ViT-Ze/4', num_classes=10, dropout=0.1)
  message = _one_line(err)
  assert 'dropout' in message
  for option in ('dropout_rate', 'stochastic_depth', 'classifier', 'posemb', 'remat'):
    assert option in message
  with pytest.raises(UserError) as err:
    create_model('ViT-Ze/4', num_classes=10, classifier='cls')
  assert 'token' in _one_line(err) and 'unpooled' in str(err.value)
  with pytest.raises(UserError):
    create_model('ViT-Ze/4', num_classes=10, posemb='sincos')
  with pytest.raises(UserError):
    create_model('ViT-Ze/4', num_classes=10, resnet=dict(layers=(1,)))
  # The module checks its own fields too (it can be built without create_model).
  model = VisionTransformer(num_classes=3, patch_size=4, hidden_size=32, num_layers=1,
                            num_heads=2, mlp_dim=8, classifier='bogus')
  with pytest.raises(UserError):
    model.init(_key(0), jnp.zeros((1, 8, 8, 1)), train=False)


def test_gelu_remat_recomputes_only_the_gelu_output():
  """remat='gelu': the same loss and gradients as no remat, and of the MLP's [B, N, mlp_dim]
  tensors only the first Dense's output is saved for the backward pass (the GELU's are not)."""
  x = jax.random.normal(jax.random.key(0), (2, 28, 28, 1))
  models = {r: create_model('ViT-Ze/4', num_classes=10, remat=r) for r in ('none', 'gelu')}
  params = models['none'].init(jax.random.key(1), x, train=False)['params']
  mlp_dim, layers = 64, 2  # ViT-Ze/4 (vit_jax/models/variants.py)
  assert params['Transformer']['encoderblock_1']['MlpBlock_0']['Dense_0']['kernel'].shape[1] == (
      mlp_dim)
  assert 'encoderblock_2' not in params['Transformer']

  def loss(model):
    return lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, x, train=False)))

  got, want = (jax.value_and_grad(loss(models[r]))(params) for r in ('gelu', 'none'))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)

  def mlp_sized(r):  # the saved residuals of shape [B, N, mlp_dim], as JAX prints them
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      ad_checkpoint.print_saved_residuals(loss(models[r]), params)
    return out.getvalue().count(f'[2,50,{mlp_dim}]')

  assert mlp_sized('gelu') == layers and mlp_sized('none') > layers
