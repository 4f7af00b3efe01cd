"""timm state dicts and .safetensors files (vit_jax.formats.timm_layout), without torch.

The layout is checked three ways: (1) exact round trips ours -> timm -> ours for plain, gap and
hybrid models; (2) the timm key names and shapes of a hybrid against those of timm 1.0.31's
`vit_tiny_r_s16_p8_224` / `vit_base_r50_s16_224` (listed below from `model.state_dict()`);
(3) logits of an independent numpy forward pass written in timm's conventions (NCHW, fused qkv,
y = x @ W.T + b) on the converted state dict, against this project's model. Parity with timm
itself is in tests/interop (make test-interop).
"""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from flax import traverse_util

from vit_jax.formats import timm_layout
from vit_jax.models.spec import ModelSpec
from vit_jax.errors import UserError
from vit_jax.models import vit as vit_lib

STAGES = dict(resnet=dict(num_layers=(1, 1)))  # R+ViT-Ze/4 with two ResNet stages


def _abstract(name, size, channels, num_classes=10, **options):
  model = ModelSpec(name, num_classes, options, size, channels).build()
  x = jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)['params']


def _params(name, size=28, channels=1, seed=0, num_classes=10, **options):
  """Random params of the model's shapes (no zeros: every mapping is visible in the values)."""
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda s: (0.3 * rng.normal(size=s.shape)).astype(np.float32),
                      _abstract(name, size, channels, num_classes, **options))


def _zeros(name, size, channels, num_classes):
  return jax.tree.map(lambda s: np.zeros(s.shape, np.float32),
                      _abstract(name, size, channels, num_classes))


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep='/')


def _assert_same_tree(got, want):
  got, want = _flat(got), _flat(want)
  assert sorted(got) == sorted(want)
  for k in want:
    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
    assert np.array_equal(got[k], want[k]), k


@pytest.mark.parametrize('name, size, channels, heads, options', [
    ('ViT-Ze/4', 28, 1, 2, {}),
    ('ViT-Ze/4', 28, 3, 2, dict(classifier='gap')),
    ('ViT-Mu/4', 28, 1, 4, {}),
    ('R+ViT-Ze/4', 32, 3, 2, {}),
    ('R+ViT-Ze/4', 32, 3, 2, STAGES),
    ('ViT-Ze/4', 28, 3, 2, dict(classifier='map')),
], ids=['vit', 'gap', 'mu', 'stem_only', 'stages', 'map'])
def test_round_trip_is_exact(name, size, channels, heads, options):
  params = _params(name, size, channels, **options)
  state = timm_layout.to_timm(params)
  assert all(v.flags['C_CONTIGUOUS'] for v in state.values())
  _assert_same_tree(timm_layout.from_timm(state, num_heads=heads), params)


# timm 1.0.31 `vit_base_r50_s16_224().state_dict()` (first unit of stage 1) and
# `vit_tiny_r_s16_p8_224()` (stem only), as [O, I, kh, kw] / [C].
TIMM_R50_UNIT = {
    'patch_embed.backbone.stem.conv.weight': (64, 3, 7, 7),
    'patch_embed.backbone.stem.norm.weight': (64,),
    'patch_embed.backbone.stages.0.blocks.0.downsample.conv.weight': (256, 64, 1, 1),
    'patch_embed.backbone.stages.0.blocks.0.downsample.norm.bias': (256,),
    'patch_embed.backbone.stages.0.blocks.0.conv1.weight': (64, 64, 1, 1),
    'patch_embed.backbone.stages.0.blocks.0.norm1.weight': (64,),
    'patch_embed.backbone.stages.0.blocks.0.conv2.weight': (64, 64, 3, 3),
    'patch_embed.backbone.stages.0.blocks.0.conv3.weight': (256, 64, 1, 1),
    'patch_embed.backbone.stages.0.blocks.0.norm3.bias': (256,),
}
TIMM_TI_STEM = {
    'patch_embed.backbone.conv.weight': (64, 3, 7, 7),
    'patch_embed.backbone.norm.weight': (64,), 'patch_embed.backbone.norm.bias': (64,),
    'patch_embed.proj.weight': (192, 64, 8, 8), 'pos_embed': (1, 50, 192),
    'blocks.11.attn.qkv.weight': (576, 192), 'blocks.11.attn.qkv.bias': (576,),
    'blocks.11.attn.proj.weight': (192, 192), 'head.weight': (1000, 192), 'cls_token': (1, 1, 192),
}


@pytest.mark.slow
def test_hybrid_names_and_shapes_are_timms():
  ours = timm_layout.to_timm(_zeros('R50+ViT-B/16', 224, 3, num_classes=1000))
  for key, shape in TIMM_R50_UNIT.items():
    assert ours[key].shape == shape, key
  # timm's default vit_base_r50_s16_224 has num_classes=0: its 306 keys plus head.{weight,bias}.
  assert len(ours) == 308
  ours = timm_layout.to_timm(_zeros('R+ViT-Ti/16', 224, 3, num_classes=1000))
  for key, shape in TIMM_TI_STEM.items():
    assert ours[key].shape == shape, key
  assert len(ours) == 155


def _layer_norm(x, sd, name):
  mu = x.mean(-1, keepdims=True)
  sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6)
  return (x - mu) / sigma * sd[name + '.weight'] + sd[name + '.bias']


def _linear(x, sd, name):
  return x @ sd[name + '.weight'].T + sd[name + '.bias']


def _timm_style_forward(sd, images_nchw, heads, pool):
  """timm's VisionTransformer.forward in numpy float64 (no dropout, tanh GELU)."""
  sd = {k: v.astype(np.float64) for k, v in sd.items()}
  w = sd['patch_embed.proj.weight']
  d, c, p, _ = w.shape
  b, _, h, wd = images_nchw.shape
  x = images_nchw.reshape(b, c, h // p, p, wd // p, p).transpose(0, 2, 4, 1, 3, 5)
  x = x.reshape(b, -1, c * p * p) @ w.reshape(d, -1).T + sd['patch_embed.proj.bias']
  prefix = [np.broadcast_to(sd[k], (b,) + sd[k].shape[1:]) for k in ('cls_token', 'reg_token')
            if k in sd]
  if sd['pos_embed'].shape[1] == x.shape[1]:  # no_embed_class: the prefix tokens get no posemb
    x = np.concatenate(prefix + [x + sd['pos_embed']], axis=1)
  else:
    x = np.concatenate(prefix + [x], axis=1) + sd['pos_embed']
  num_prefix = sum(t.shape[1] for t in prefix)
  i = 0
  while f'blocks.{i}.norm1.weight' in sd:
    y = _layer_norm(x, sd, f'blocks.{i}.norm1')
    qkv = _linear(y, sd, f'blocks.{i}.attn.qkv').reshape(b, -1, 3, heads, d // heads)
    q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # [b, heads, n, hd] each
    a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    a = np.exp(a - a.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    y = (a @ v).transpose(0, 2, 1, 3).reshape(b, -1, d)
    x = x + _linear(y, sd, f'blocks.{i}.attn.proj')
    y = _linear(_layer_norm(x, sd, f'blocks.{i}.norm2'), sd, f'blocks.{i}.mlp.fc1')
    y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    x = x + _linear(y, sd, f'blocks.{i}.mlp.fc2')
    i += 1
  x = _layer_norm(x, sd, 'norm')
  x = x[:, 0] if pool == 'token' else x[:, num_prefix:].mean(1)
  return _linear(x, sd, 'head')


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_converted_state_dict_computes_the_same_logits(classifier):
  spec = ModelSpec('ViT-Ze/4', 10, dict(classifier=classifier), 28, 3)
  params = _params('ViT-Ze/4', channels=3, seed=1, classifier=classifier)
  images = np.random.RandomState(2).uniform(-1, 1, (3, 28, 28, 3)).astype(np.float32)
  ours = np.asarray(spec.build().apply({'params': params}, images, train=False))
  pool = timm_layout.timm_config(spec)['kwargs']['global_pool']
  theirs = _timm_style_forward(timm_layout.to_timm(params), images.transpose(0, 3, 1, 2),
                               heads=2, pool={'avg': 'avg', 'token': 'token'}[pool])
  assert np.abs(ours).max() > 0.5  # not a comparison of near-zero logits
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5 * np.abs(ours).max())
  # The check can fail: q/k/v in another order (k;q;v) changes the logits well beyond it.
  state = timm_layout.to_timm(params)
  qkv = state['blocks.0.attn.qkv.weight']
  state['blocks.0.attn.qkv.weight'] = np.concatenate([qkv[32:64], qkv[:32], qkv[64:]])
  wrong = _timm_style_forward(state, images.transpose(0, 3, 1, 2), 2, 'token' if
                              classifier == 'token' else 'avg')
  assert np.abs(wrong - ours).max() > 1e-3


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_register_tokens_convert_both_ways_with_the_same_logits(classifier):
  """Registers: ours -> timm (reg_tokens, no_embed_class=True) computes our logits, and back; a
  timm state dict whose pos_embed also covers cls and the registers (no_embed_class=False) reads
  with its logits."""
  spec = ModelSpec('ViT-Ze/4', 10, dict(classifier=classifier, num_registers=3), 28, 3)
  model = spec.build()
  params = _params('ViT-Ze/4', channels=3, seed=4, **spec.options)
  images = np.random.RandomState(5).uniform(-1, 1, (3, 28, 28, 3)).astype(np.float32)
  ours = np.asarray(model.apply({'params': params}, images, train=False))
  kwargs = timm_layout.timm_config(spec)['kwargs']
  assert (kwargs['reg_tokens'], kwargs['no_embed_class']) == (3, True)
  state = timm_layout.to_timm(params)
  assert state['reg_token'].shape == (1, 3, 32) and state['pos_embed'].shape == (1, 49, 32)
  pool = 'token' if classifier == 'token' else 'avg'
  nchw = images.transpose(0, 3, 1, 2)
  scale = np.abs(ours).max()
  assert scale > 0.5
  np.testing.assert_allclose(_timm_style_forward(state, nchw, 2, pool), ours, atol=2e-5 * scale)
  back = timm_layout.from_timm(state, num_heads=2)
  np.testing.assert_allclose(model.apply({'params': back}, images, train=False), ours,
                             atol=2e-6 * scale)
  if classifier == 'token':  # rows for cls, the registers and the patches
    rows = np.random.RandomState(6).normal(0, 0.3, (1, 3, 32)).astype(np.float32)
    pe = params['Transformer']['posembed_input']['pos_embedding']
    state = {**state, 'cls_token': params['cls'],
             'pos_embed': np.concatenate([pe[:, :1], rows, pe[:, 1:]], axis=1)}
    theirs = _timm_style_forward(state, nchw, 2, pool)
    back = timm_layout.from_timm(state, num_heads=2)
    np.testing.assert_allclose(model.apply({'params': back}, images, train=False), theirs,
                               atol=2e-5 * scale)
    assert np.abs(theirs - ours).max() > 1e-3  # the register rows count: the check can fail


def test_timm_config_of_registered_and_small_models():
  cfg = timm_layout.timm_config(ModelSpec('ViT-B/16', 1000, {}, 224, 3))
  assert cfg['architecture'] == 'vit_base_patch16_224'
  assert cfg['kwargs'] == dict(img_size=224, patch_size=16, in_chans=3, num_classes=1000,
                               embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0,
                               global_pool='token', class_token=True, fc_norm=False,
                               pos_embed='learn', act_layer='gelu_tanh')
  cfg = timm_layout.timm_config(ModelSpec('R50+ViT-B/16', 5, dict(gelu_approximate=False), 384, 3))
  assert cfg['architecture'] == 'vit_base_r50_s16_224' and cfg['resnet'] == [3, 4, 9]
  assert cfg['kwargs']['act_layer'] == 'gelu' and cfg['kwargs']['patch_size'] == 1
  cfg = timm_layout.timm_config(ModelSpec('ViT-Ze/4', 3, dict(classifier='gap'), 28, 1))
  assert cfg['architecture'] is None
  assert (cfg['kwargs']['global_pool'], cfg['kwargs']['class_token']) == ('avg', False)


# ---------------------------------------------------------------------------------------------
# .safetensors files.


def test_safetensors_file_round_trip_with_spec(tmp_path):
  spec = ModelSpec('R+ViT-Ze/4', 10, STAGES, 32, 3)
  params = _params('R+ViT-Ze/4', 32, 3, seed=3, **STAGES)
  path = str(tmp_path / 'm.safetensors')
  state = timm_layout.save_safetensors(path, params, spec=spec, class_names='abcdefghij')
  stored = safetensors.numpy.load_file(path)  # the package's own reader sees timm's layout
  assert sorted(stored) == sorted(state)
  for k in state:
    assert np.array_equal(stored[k], state[k]), k
  loaded, got_spec = timm_layout.load_safetensors(path)
  _assert_same_tree(loaded, params)
  assert got_spec == spec
  tensors, metadata = timm_layout.read_safetensors(path)
  assert metadata['format'] == 'pt'
  info = json.loads(metadata['vit_jax'])
  assert info['class_names'] == list('abcdefghij')
  assert info['timm']['resnet'] == [1, 1]
  assert timm_layout.stored_class_names(metadata, path) == tuple('abcdefghij')


def test_sincos_posemb_is_written_for_timm_and_dropped_on_load(tmp_path):
  spec = ModelSpec('ViT-Ze/4', 10, dict(posemb='sincos2d'), 28, 1)
  params = _params('ViT-Ze/4', posemb='sincos2d')
  assert 'posembed_input' not in params['Transformer']
  path = str(tmp_path / 'sincos.safetensors')
  state = timm_layout.save_safetensors(path, params, spec=spec)
  table = vit_lib.sincos2d_posemb(7, 7, 32)
  np.testing.assert_array_equal(state['pos_embed'][0, 1:], table)
  assert not state['pos_embed'][0, 0].any()  # the cls slot
  loaded, _ = timm_layout.load_safetensors(path)
  _assert_same_tree(loaded, params)


def test_bfloat16_and_foreign_files(tmp_path):
  params = _params('ViT-Ze/4', seed=4)
  state = timm_layout.to_timm(params)
  path = str(tmp_path / 'bf16.safetensors')
  # A file from elsewhere (no vit_jax metadata) with bfloat16 tensors, as some hub files are.
  header = {k: {'dtype': 'BF16', 'shape': list(v.shape)} for k, v in state.items()}
  offset, blobs = 0, []
  for k, v in state.items():
    blob = v.astype(ml_dtypes.bfloat16).tobytes()
    header[k]['data_offsets'] = [offset, offset + len(blob)]
    offset += len(blob)
    blobs.append(blob)
  head = json.dumps(header).encode()
  with open(path, 'wb') as f:
    f.write(len(head).to_bytes(8, 'little') + head + b''.join(blobs))
  with pytest.raises(UserError, match='how many attention heads'):
    timm_layout.load_safetensors(path)
  loaded, spec = timm_layout.load_safetensors(path, num_heads=2)
  assert spec is None
  want = jax.tree.map(lambda v: v.astype(ml_dtypes.bfloat16).astype(np.float32), params)
  _assert_same_tree(loaded, want)


@pytest.mark.parametrize('kind', ['empty', 'truncated', 'garbage', 'npz'])
def test_unreadable_safetensors_give_one_line(tmp_path, kind):
  good = str(tmp_path / 'good.safetensors')
  timm_layout.save_safetensors(good, _params('ViT-Ze/4'))
  data = open(good, 'rb').read()
  content = {'empty': b'', 'truncated': data[:len(data) // 2], 'garbage': b'\x00' * 100,
             'npz': b'PK\x03\x04' + data[4:200]}[kind]
  path = tmp_path / f'{kind}.safetensors'
  path.write_bytes(content)
  with pytest.raises(UserError) as e:
    timm_layout.load_safetensors(str(path), num_heads=2)
  text = str(e.value)
  assert str(path) in text and '\n' not in text
  assert ('is empty' if kind == 'empty' else 'not a readable .safetensors file') in text, text


def test_what_timm_cannot_hold_is_refused():
  i21k = _params('ViT-Ze/4', representation_size=32)
  with pytest.raises(UserError, match='pre_logits.*drop_pre_logits'):
    timm_layout.to_timm(i21k)
  state = timm_layout.to_timm(i21k, drop_pre_logits=True)
  assert not any('pre_logits' in k for k in state)
  state['fc_norm.weight'] = np.ones(32, np.float32)
  with pytest.raises(UserError, match='fc_norm'):
    timm_layout.from_timm(state, num_heads=2)
  del state['fc_norm.weight']
  state['blocks.0.ls1.gamma'] = np.zeros(32, np.float32)
  with pytest.raises(UserError, match=r'keys this project\'s ViT does not have: 1 key '
                                      r'\(blocks.0.ls1.gamma\)'):
    timm_layout.from_timm(state, num_heads=2)
  with pytest.raises(UserError, match=r"timm's attention pool .* also attends to the register"):
    timm_layout.to_timm(_params('ViT-Ze/4', classifier='map', num_registers=2))
  with pytest.raises(UserError, match='does not split into q, k, v of 3 heads'):
    timm_layout.from_timm(timm_layout.to_timm(_params('ViT-Ze/4')), num_heads=3)
  with pytest.raises(UserError, match='cannot convert 1 key \\(extra/kernel\\)'):
    timm_layout.to_timm({**_params('ViT-Ze/4'), 'extra': {'kernel': np.ones((2, 2))}})
