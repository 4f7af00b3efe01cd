"""BiT ResNet-v2 baselines: registered variants, exact param counts (closed form and timm), the
param tree, a numpy reference forward pass, init, the option policy, dtypes, stochastic depth,
XLA FLOPs against a closed form, and a few training steps through `vit_jax.main`."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.configs import common
from vit_jax.errors import UserError
from vit_jax.models import VARIANTS, BiT, create_model, decode_variant
from vit_jax.models import bit as bit_lib
from vit_jax.models import cost
from vit_jax.models import options as options_lib
from helpers import ROOT, optimized_env

UNITS = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
         152: (3, 8, 36, 3)}


def _key(seed=0):
  return jax.random.key(seed, impl='rbg')


def _shapes(name, size=32, channels=3, num_classes=1000, **overrides):
  model = create_model(name, num_classes=num_classes, **overrides)
  x = jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32)
  params = jax.eval_shape(lambda x: model.init(_key(), x, train=False), x)['params']
  return {k: v.shape for k, v in traverse_util.flatten_dict(params, sep='/').items()}


# ---------------------------------------------------------------------------------------------
# Parameter counts.


def _closed_form_count(units, width_factor, channels, classes):
  """The count derived in models/bit.py's docstring, term by term."""
  w = int(64 * width_factor)
  total = 49 * channels * w  # conv_root
  c = w
  for s, n in enumerate(units):
    m = w * 2 ** s
    for u in range(n):
      total += 2 * c + c * m + 2 * m + 9 * m * m + 2 * m + 4 * m * m
      if u == 0:
        total += c * 4 * m  # conv_proj
      c = 4 * m
  return total + 2 * c + c * classes + classes  # norm-pre-head, head


# 1000 classes, RGB. Pinned literals; the closed form and the model must both give them.
COUNT_1K = {
    'BiT-R50x1': 25_549_352,  # = timm resnetv2_50x1_bit
    'BiT-R50x2': 97_988_712, 'BiT-R50x3': 217_319_080, 'BiT-R50x4': 383_540_456,
    'BiT-R101x1': 44_541_480, 'BiT-R101x2': 173_852_776, 'BiT-R101x3': 387_934_888,
    'BiT-R101x4': 686_787_816,
    'BiT-R152x1': 60_185_128, 'BiT-R152x2': 236_335_208, 'BiT-R152x3': 528_451_240,
    'BiT-R152x4': 936_533_224,
}
# The small CPU variants: 10 classes, grayscale (mnist5k).
COUNT_SMALL = {'BiT-R50x0.5': 5_895_914, 'BiT-R26x0.5': 3_499_882, 'BiT-R14x0.5': 2_014_442}


def test_every_registered_bit_is_pinned():
  bits = {v for v in VARIANTS if v.startswith('BiT-')}
  assert bits == set(COUNT_1K) | set(COUNT_SMALL)
  for name in bits:
    assert create_model(name, num_classes=10).__class__ is BiT


@pytest.mark.parametrize('name', sorted(COUNT_1K))
@pytest.mark.slow
def test_param_count_1k(name):
  depth, width = name[len('BiT-R'):].split('x')
  assert _closed_form_count(UNITS[int(depth)], float(width), 3, 1000) == COUNT_1K[name]
  # Param shapes do not depend on the image size: trace on 32 px.
  assert sum(math.prod(s) for s in _shapes(name).values()) == COUNT_1K[name]


@pytest.mark.parametrize('name', sorted(COUNT_SMALL))
def test_param_count_small(name):
  depth, width = name[len('BiT-R'):].split('x')
  assert _closed_form_count(UNITS[int(depth)], float(width), 1, 10) == COUNT_SMALL[name]
  assert sum(math.prod(s) for s in _shapes(name, 28, 1, 10).values()) == COUNT_SMALL[name]


def test_decode():
  assert decode_variant('BiT-R50x1') == dict(num_layers=(3, 4, 6, 3), width_factor=1)
  assert decode_variant('BiT-R152x4') == dict(num_layers=(3, 8, 36, 3), width_factor=4)
  assert decode_variant('BiT-R26x0.5') == dict(num_layers=(2, 2, 2, 2), width_factor=0.5)
  assert decode_variant('BiT-R101x1.5') == dict(num_layers=(3, 4, 23, 3), width_factor=1.5)


@pytest.mark.parametrize('bad, needle', [
    ('BiT-R34x1', 'depth in 14,26,50,101,152'),   # no bottleneck R34
    ('BiT-R50', 'BiT-R<depth>x<width>'),
    ('BiT-R50x0.25', '16.0 root channels'),       # 16 channels cannot make 32 GroupNorm groups
    ('BiT-R50x0', 'multiple of 0.5'),
])
def test_bad_names(bad, needle):
  with pytest.raises(UserError) as err:
    create_model(bad, num_classes=10)
  assert '\n' not in str(err.value) and needle in str(err.value)


# ---------------------------------------------------------------------------------------------
# Param tree.


def test_param_tree_r50x1():
  p = _shapes('BiT-R50x1')
  assert p['root_block/conv_root/kernel'] == (7, 7, 3, 64)
  assert {k.split('/')[0] for k in p} == {'root_block', 'block1', 'block2', 'block3', 'block4',
                                           'norm-pre-head', 'head'}
  assert not [k for k in p if 'conv' in k and not k.endswith('/kernel')]  # convs have no bias
  assert not [k for k in p if 'gn_proj' in k or 'gn_root' in k]
  assert p['block1/unit01/gn1/scale'] == (64,)  # pre-activation: gn1 sees the unit's input
  assert p['block1/unit01/conv1/kernel'] == (1, 1, 64, 64)
  assert p['block1/unit01/conv2/kernel'] == (3, 3, 64, 64)
  assert p['block1/unit01/gn3/scale'] == (64,)
  assert p['block1/unit01/conv3/kernel'] == (1, 1, 64, 256)
  assert p['block1/unit01/conv_proj/kernel'] == (1, 1, 64, 256)
  assert p['block1/unit02/gn1/scale'] == (256,)
  assert 'block1/unit02/conv_proj/kernel' not in p
  assert p['block2/unit01/gn1/bias'] == (256,)
  assert p['block2/unit01/conv_proj/kernel'] == (1, 1, 256, 512)
  assert p['block3/unit06/conv2/kernel'] == (3, 3, 256, 256)
  assert 'block3/unit07/conv1/kernel' not in p
  assert p['block4/unit03/conv3/kernel'] == (1, 1, 512, 2048)
  assert p['norm-pre-head/scale'] == p['norm-pre-head/bias'] == (2048,)
  assert p['head/kernel'] == (2048, 1000) and p['head/bias'] == (1000,)


# ---------------------------------------------------------------------------------------------
# Forward pass against an independent numpy implementation of the BiT paper's code.


def _np_pad(x, lo, hi, value=0.):
  return np.pad(x, ((0, 0), (lo, hi), (lo, hi), (0, 0)), constant_values=value)


def _np_std_conv(x, w, stride=1, pad=0):
  w = (w - w.mean((0, 1, 2))) / np.sqrt(w.var((0, 1, 2)) + 1e-10)
  x = _np_pad(x, pad, pad)
  k = w.shape[0]
  oh, ow = (x.shape[1] - k) // stride + 1, (x.shape[2] - k) // stride + 1
  return sum(x[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :] @ w[i, j]
             for i in range(k) for j in range(k))


def _np_gn(x, p, groups=32, eps=1e-5):
  n, h, w, c = x.shape
  g = x.reshape(n, h, w, groups, c // groups)
  mean = g.mean((1, 2, 4), keepdims=True)
  var = ((g - mean) ** 2).mean((1, 2, 4), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape) * p['scale'] + p['bias']


def _np_bit(params, x, pool_pad=0.):
  """BiT ResNet-v2 forward in float64; `pool_pad` is the value the max-pool padding holds."""
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  relu = lambda y: np.maximum(y, 0)
  x = _np_std_conv(np.asarray(x, np.float64), params['root_block']['conv_root']['kernel'], 2, 3)
  x = _np_pad(x, 1, 1, pool_pad)
  oh = (x.shape[1] - 3) // 2 + 1
  x = np.max([x[:, i:i + 2 * oh:2, j:j + 2 * oh:2] for i in range(3) for j in range(3)], 0)
  s = 1
  while f'block{s}' in params:
    for u, (_, p) in enumerate(sorted(params[f'block{s}'].items())):
      stride = 2 if s > 1 and u == 0 else 1
      pre = relu(_np_gn(x, p['gn1']))
      short = _np_std_conv(pre, p['conv_proj']['kernel'], stride) if 'conv_proj' in p else x
      y = _np_std_conv(pre, p['conv1']['kernel'])
      y = _np_std_conv(relu(_np_gn(y, p['gn2'])), p['conv2']['kernel'], stride, 1)
      x = short + _np_std_conv(relu(_np_gn(y, p['gn3'])), p['conv3']['kernel'])
    s += 1
  x = relu(_np_gn(x, params['norm-pre-head'])).mean((1, 2))
  return x @ params['head']['kernel'] + params['head']['bias']


def _random_params(model, x, scale=0.003):
  """Every param random: small conv kernels (so the eps placement of the weight
  standardisation matters), GroupNorm scale ~1 and bias ~0 but not exactly, a random head."""
  shapes = jax.eval_shape(lambda x: model.init(_key(), x, train=False), x)['params']
  flat = traverse_util.flatten_dict(shapes, sep='/')
  rng = np.random.RandomState(0)
  out = {}
  for k, v in flat.items():
    if k.endswith('scale'):
      out[k] = 1 + 0.2 * rng.normal(size=v.shape)
    elif k.endswith('bias'):
      out[k] = 0.2 * rng.normal(size=v.shape)
    else:
      out[k] = (scale if k != 'head/kernel' else 1.) * rng.normal(size=v.shape) + 0.001
  return traverse_util.unflatten_dict({k: v.astype(np.float32) for k, v in out.items()}, sep='/')


# Two stages (2 + 1 units: identity and projection shortcuts, strides 1 and 2) and one unit:
# cheap to compile.
SMALL = dict(num_layers=(2, 1))
TINY = dict(num_layers=(1,))


def test_forward_matches_numpy_reference():
  model = create_model('BiT-R14x0.5', num_classes=10, **SMALL)
  # Odd size (21 -> 11 -> 6 -> 3: every padding matters) and a small input scale, so that the
  # first GroupNorm's eps (1e-5, not flax's 1e-6) changes the output measurably.
  x = np.random.RandomState(1).uniform(-0.01, 0.01, (2, 21, 21, 1)).astype(np.float32)
  params = _random_params(model, x)
  out = np.asarray(jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(params, x))
  ref = _np_bit(params, x)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
  # The test can tell the details apart: -inf max-pool padding (big_vision bit_paper.py) changes
  # the logits by much more than the tolerance.
  assert np.abs(_np_bit(params, x, pool_pad=-np.inf) - ref).max() > 1e-2 * np.abs(ref).max()


def test_weight_standardisation_and_group_norm_forms():
  # BiT: (w - mean) / sqrt(var + eps) with eps 1e-10; the hybrid's std + 1e-5 differs for
  # small kernels. A two-pass GroupNorm variance with eps 1e-5.
  w = np.random.RandomState(0).normal(size=(3, 3, 4, 5)) * 1e-3
  bit_ws = (w - w.mean((0, 1, 2))) / np.sqrt(w.var((0, 1, 2)) + 1e-10)
  from vit_jax.models import resnet as resnet_lib  # pylint: disable=g-import-not-at-top
  got = resnet_lib.weight_standardize(jnp.asarray(w, jnp.float32), bit_lib.WS_EPS,
                                      eps_in_sqrt=True)
  np.testing.assert_allclose(got, bit_ws, rtol=1e-4, atol=1e-5)
  hybrid = resnet_lib.weight_standardize(jnp.asarray(w, jnp.float32))
  assert np.abs(np.asarray(hybrid) - bit_ws).max() > 1e-2
  # A large mean and a small spread: E[x^2] - E[x]^2 in float32 loses the variance.
  x = (1000. + np.random.RandomState(1).normal(size=(1, 4, 4, 32)) * 0.01).astype(np.float32)
  gn = bit_lib._group_norm('gn', None, jnp.float32)  # pylint: disable=protected-access
  variables = gn.init(_key(), x)
  ref = _np_gn(x.astype(np.float64), {'scale': 1., 'bias': 0.})
  # (flax's default E[x^2] - E[x]^2 is off by about 7 here.)
  np.testing.assert_allclose(gn.apply(variables, x), ref, atol=0.05)


# ---------------------------------------------------------------------------------------------
# Initialisation.


def test_init():
  model = create_model('BiT-R14x0.5', num_classes=10, head_bias_init=-2.5, **TINY)
  x = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 1)).astype(np.float32)
  logits, variables = jax.jit(lambda x: model.init_with_output(_key(3), x, train=False))(x)
  flat = traverse_util.flatten_dict(variables['params'], sep='/')
  # Zero head: the logits are the head bias.
  assert np.all(np.asarray(flat['head/kernel']) == 0)
  np.testing.assert_array_equal(logits, np.full((2, 10), -2.5, np.float32))
  for k, v in flat.items():
    if k.endswith('scale'):
      assert np.all(np.asarray(v) == 1), k  # no zero-init GroupNorm (unlike the v1 hybrid)
    elif k.endswith('bias') and not k.startswith('head'):
      assert np.all(np.asarray(v) == 0), k
  # Conv kernels: flax's lecun_normal (truncated normal, std 1/sqrt(fan_in)).
  w = np.asarray(flat['block1/unit01/conv2/kernel'])  # 3x3x32x32: 9216 samples
  assert abs(w.std() * math.sqrt(9 * 32) - 1) < 0.03 and abs(w.mean()) < 0.04 / math.sqrt(9 * 32)


# ---------------------------------------------------------------------------------------------
# Options: one policy for the options a family does not have.


def test_config_defaults_are_the_neutral_values():
  """The trainer passes config.model to every model: its defaults must be the values the policy
  accepts for a family without the option (vit_jax/configs/common.py == the module field defaults)."""
  model_options = common.base_config().model.to_dict()
  assert set(model_options) <= set(options_lib.OPTIONS)
  taken_by_all = set.intersection(*(set(options_lib._fields(c))  # pylint: disable=protected-access
                                    for c in options_lib.FAMILIES))
  for key, value in model_options.items():
    if key not in taken_by_all:
      assert value == options_lib.DEFAULTS[key], key
  model = create_model('BiT-R14x0.5', num_classes=10, **model_options)
  assert isinstance(model, BiT) and model.dtype == jnp.float32


@pytest.mark.parametrize('option, value', [
    ('dropout_rate', 0.1), ('attention_dropout_rate', 0.1), ('posemb', 'sincos2d'),
    ('representation_size', 16), ('gelu_approximate', False), ('remat', True),
    ('classifier', 'unpooled'), ('hidden_size', 64), ('patch_size', 4),
])
def test_bit_refuses_options_that_do_not_apply(option, value):
  with pytest.raises(UserError) as err:
    create_model('BiT-R14x0.5', num_classes=10, **{option: value})
  message = str(err.value)
  assert '\n' not in message
  assert message.startswith(f'model.{option}={value!r} does not apply to BiT-R14x0.5')
  default = options_lib.DEFAULTS[option]
  if default is not dataclasses.MISSING:
    assert f'leave it at its default {default!r}' in message


def test_neutral_values_are_accepted():
  # The defaults, and classifier='gap', which is what a ResNet does anyway.
  for classifier in ('token', 'gap'):
    assert isinstance(create_model('BiT-R14x0.5', num_classes=10, classifier=classifier), BiT)
  create_model('BiT-R14x0.5', num_classes=10, dropout_rate=0.0, posemb='learned', remat='none',
               representation_size=None, gelu_approximate=True)
  # The same policy the other way round: a ViT does not take width_factor.
  assert create_model('ViT-Ze/4', num_classes=10, width_factor=1).hidden_size == 32
  with pytest.raises(UserError, match=r'^model.width_factor=2 does not apply to ViT-Ze/4'):
    create_model('ViT-Ze/4', num_classes=10, width_factor=2)
  with pytest.raises(UserError, match='unknown model option'):
    create_model('BiT-R14x0.5', num_classes=10, dropout=0.1)


def test_options_that_apply_are_passed():
  model = create_model('BiT-R14x0.5', num_classes=10, stochastic_depth=0.2, head_bias_init=-1.,
                       dtype='bfloat16', param_dtype='float32', width_factor=1,
                       num_layers=(1, 2, 1, 1))
  assert (model.stochastic_depth, model.head_bias_init) == (0.2, -1.)
  assert jnp.dtype(model.dtype) == jnp.bfloat16 and jnp.dtype(model.param_dtype) == jnp.float32
  assert (model.width_factor, model.num_layers) == (1, (1, 2, 1, 1))
  with pytest.raises(UserError, match='not a dtype'):
    create_model('BiT-R14x0.5', num_classes=10, dtype='float33')


# ---------------------------------------------------------------------------------------------
# dtypes, stochastic depth.


def test_bfloat16_compute():
  x = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 1)).astype(np.float32)
  f32 = create_model('BiT-R14x0.5', num_classes=10, **TINY)
  bf16 = create_model('BiT-R14x0.5', num_classes=10, dtype='bfloat16', **TINY)
  params = _random_params(f32, x, scale=0.1)
  run = lambda m: jax.jit(lambda p, x: m.apply({'params': p}, x, train=False,
                                               capture_intermediates=True))(params, x)
  ref, _ = run(f32)
  out, state = run(bf16)
  assert out.dtype == jnp.float32
  inter = state['intermediates']
  assert inter['root_block']['conv_root']['__call__'][0].dtype == jnp.bfloat16
  assert inter['block1']['unit01']['conv3']['__call__'][0].dtype == jnp.bfloat16
  assert inter['block1']['unit01']['gn3']['__call__'][0].dtype == jnp.bfloat16
  assert not np.array_equal(out, ref)
  np.testing.assert_allclose(out, ref, rtol=0.05, atol=0.05 * np.abs(ref).max())
  # param_dtype: the params are born bfloat16.
  shapes = jax.eval_shape(lambda x: create_model('BiT-R14x0.5', num_classes=10,
                                                 param_dtype='bfloat16').init(_key(), x,
                                                                              train=False), x)
  assert {p.dtype for p in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}


def test_drop_path_rates():
  rates = bit_lib.drop_path_rates((1, 2, 1), 0.3)
  assert [len(r) for r in rates] == [1, 2, 1]
  np.testing.assert_allclose(sum(rates, ()), (0., 0.1, 0.2, 0.3), rtol=1e-12)
  assert bit_lib.drop_path_rates((1,), 0.5) == ((0.,),)


def test_stochastic_depth_drops_the_last_unit():
  # One stage of two units, rates (0, 1): in training the second unit's residual branch is
  # always dropped (its shortcut is the identity), so the model is its one-unit prefix.
  x = np.random.RandomState(0).uniform(-1, 1, (2, 12, 12, 1)).astype(np.float32)
  two = BiT(num_classes=5, num_layers=(2,), width_factor=0.5, stochastic_depth=1.0)
  one = BiT(num_classes=5, num_layers=(1,), width_factor=0.5)
  params = _random_params(two, x, scale=0.1)
  prefix = {k: v for k, v in params.items()}
  prefix['block1'] = {'unit01': params['block1']['unit01']}
  train = two.apply({'params': params}, x, train=True, rngs={'dropout': _key(1)})
  np.testing.assert_allclose(train, one.apply({'params': prefix}, x, train=False), rtol=1e-5,
                             atol=1e-5)
  assert not np.allclose(train, two.apply({'params': params}, x, train=False), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# FLOPs from XLA against a closed form.


def _conv_flops(size, units, width_factor, channels, classes):
  """2 x multiply-adds of every conv and the head, counting only kernel taps that fall on the
  input (XLA's cost analysis skips the zero padding), for a square image."""

  def conv(h, k, s, p, cin, cout):
    oh = (h + 2 * p - k) // s + 1
    taps = sum(1 for o in range(oh) for t in range(k) if 0 <= o * s - p + t < h)
    return 2 * taps * taps * cin * cout, oh

  w = int(64 * width_factor)
  total, h = conv(size, 7, 2, 3, channels, w)
  h = (h + 2 - 3) // 2 + 1
  c = w
  for s, n in enumerate(units):
    m = w * 2 ** s
    for u in range(n):
      stride = 2 if s and not u else 1
      f1, _ = conv(h, 1, 1, 0, c, m)
      f2, oh = conv(h, 3, stride, 1, m, m)
      f3, _ = conv(oh, 1, 1, 0, m, 4 * m)
      total += f1 + f2 + f3 + (conv(h, 1, stride, 0, c, 4 * m)[0] if u == 0 else 0)
      h, c = oh, 4 * m
  return total + 2 * c * classes


def test_xla_flops_match_the_closed_form():
  model = create_model('BiT-R14x0.5', num_classes=10, **SMALL)
  flops = cost.flops(model, (28, 28, 1))
  convs = _conv_flops(28, SMALL['num_layers'], 0.5, 1, 10)
  assert _conv_flops(28, (1, 1, 1, 1), 0.5, 1, 10) == 11_985_920  # BiT-R14x0.5 (README)
  # Norms, ReLUs, pooling and adds on top of the convs: a few percent.
  assert convs < flops.per_image < 1.05 * convs
  # Standardising the kernels once per step: a few FLOPs per conv weight.
  conv_weights = sum(math.prod(s) for k, s in _shapes('BiT-R14x0.5', 28, 1, 10, **SMALL).items()
                     if '/conv' in k)
  assert 2 * conv_weights < flops.per_step < 10 * conv_weights
  assert flops.total(64) == 64 * flops.per_image + flops.per_step


# ---------------------------------------------------------------------------------------------
# Training through vit_jax.main.


@pytest.mark.slow
def test_main_trains_a_bit(tmp_path, data_dir):
  # With XLA's optimisations: unoptimised convolutions make this 6-step run and its eval of
  # 1,000 images cost more CPU than compiling them optimised.
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main',
       '--config=configs/mnist5k.py:model_name=BiT-R14x0.5,steps=6,batch_size=32,lr=3e-3',
       f'--workdir={tmp_path}', f'--config.data_dir={data_dir}', '--config.warmup_steps=1',
       '--config.log_every=3', '--config.eval_every=6', '--config.progress=False',
       '--config.model.classifier=gap'],  # accepted: what a ResNet does anyway
      cwd=ROOT, capture_output=True, text=True, timeout=300, env=optimized_env())
  assert proc.returncode == 0, proc.stderr
  assert 'final test top-1 accuracy:' in proc.stdout and '(1000 examples)' in proc.stdout
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['6']
  with open(tmp_path / 'metrics.jsonl') as f:
    rows = [json.loads(line) for line in f]
  train = [r for r in rows if r['split'] == 'train']
  assert [r['step'] for r in train] == [3, 6]
  assert train[1]['loss'] < train[0]['loss'] < math.log(10) + 0.1  # zero head: starts at ln 10
  (final,) = [r for r in rows if r['split'] == 'eval']
  # Chance is 0.1 (loss ln 10 = 2.30); measured after these 6 steps: 0.20, loss 2.20.
  assert final['accuracy'] > 0.15 and final['loss'] < math.log(10) - 0.05
  # The analysis figures need a ViT: a BiT run gets one line, not a traceback.
  from vit_jax.analysis import report  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=r'^BiT-R14x0.5 is a BiT, without the attention'):
    report.write_report(workdir=str(tmp_path), out=str(tmp_path / 'analysis'))


# ---------------------------------------------------------------------------------------------
# .npz export and import (the released layout: GroupNorm params [1,1,1,C], as bit_paper.py).


def test_npz_round_trip(tmp_path):
  from vit_jax.formats import npz  # pylint: disable=g-import-not-at-top
  model = create_model('BiT-R14x0.5', num_classes=10, **SMALL)
  x = np.zeros((1, 28, 28, 1), np.float32)
  params = _random_params(model, x)
  path = str(tmp_path / 'bit.npz')
  npz.save_npz(path, params)
  with np.load(path) as f:
    assert f['norm-pre-head/scale'].shape == (1, 1, 1, 256)
    assert f['block2/unit01/gn1/bias'].shape == (1, 1, 1, 128)
    assert f['root_block/conv_root/kernel'].shape == (7, 7, 1, 32)
  loaded = npz.load_for_model(path, model, (28, 28, 1))
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  with pytest.raises(UserError, match='checkpoint does not fit'):
    npz.load_for_model(path, create_model('BiT-R14x0.5', num_classes=10), (28, 28, 1))
