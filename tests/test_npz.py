"""Tests of vit_jax.formats.npz: the official .npz layouts (the released
checkpoints' parameter names, the original code's `models_vit.py`).

Files are made here from tiny models' param shapes filled with known random values and renamed by
mappings written independently in this file (`_released_names`, `_big_vision`). The big_vision
posemb conversion is checked against a plain-numpy forward pass written from the big_vision
definition x = [cls; patches + pos_embedding].
"""

import io
import os
import pickle
import zipfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.formats import check_params, load_for_model, load_npz, read_npz, save_npz
from vit_jax.errors import UserError
from vit_jax.models import create_model

POSEMB = 'Transformer/posembed_input/pos_embedding'
HYBRID = dict(resnet=dict(num_layers=(1, 1)))  # R+ViT-Ze/4 with two stages: conv_proj, gn1..3


def _abstract(name, size, channels, num_classes=10, **overrides):
  model = create_model(name, num_classes=num_classes, **overrides)
  x = jax.ShapeDtypeStruct((1, size, size, channels), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
  return variables['params']


def _random_flat(name, size=28, channels=1, seed=0, **overrides):
  """Flat {key: float32 array} with the model's shapes and random values (no zero inits)."""
  flat = traverse_util.flatten_dict(_abstract(name, size, channels, **overrides), sep='/')
  rng = np.random.RandomState(seed)
  return {k: (0.3 * rng.normal(size=v.shape)).astype(np.float32) for k, v in flat.items()}


def _nested(flat):
  return traverse_util.unflatten_dict(flat, sep='/')


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep='/')


def _assert_same(got_tree, want_flat):
  got = _flat(got_tree)
  assert sorted(got) == sorted(want_flat)
  for k, want in want_flat.items():
    assert isinstance(got[k], np.ndarray), k
    assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
    assert got[k].tobytes() == want.tobytes(), k  # bitwise


def _released_names(flat):
  """Our linen names -> the original release's pre-linen names, GN params as [1,1,1,C]."""
  rename = {'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
            'LayerNorm_1': 'LayerNorm_2', 'MlpBlock_0': 'MlpBlock_3'}
  out = {}
  for key, value in flat.items():
    parts = key.split('/')
    if len(parts) > 2 and parts[0] == 'Transformer' and parts[1].startswith('encoderblock_'):
      parts[2] = rename.get(parts[2], parts[2])
    if len(parts) >= 2 and parts[-2].startswith('gn') and parts[-1] in ('scale', 'bias'):
      value = value.reshape(1, 1, 1, value.shape[0])
    out['/'.join(parts)] = value
  return out


def _big_vision(flat, prefix='params/'):
  """big_vision names: top-level pos_embedding without the cls slot; blocks keep linen names."""
  out = {prefix + k: v for k, v in flat.items() if k != POSEMB}
  out[prefix + 'pos_embedding'] = flat[POSEMB][:, 1:] if 'cls' in flat else flat[POSEMB]
  return out


def _write(path, flat):
  np.savez(path, **flat)
  return str(path)


# ---------------------------------------------------------------------------------------------
# Reading the three layouts (and opt/target).


@pytest.mark.parametrize('overrides', [{}, dict(representation_size=32)], ids=['vit', 'i21k'])
def test_released_layout_loads_exactly(tmp_path, overrides):
  flat = _random_flat('ViT-Ze/4', **overrides)
  path = _write(tmp_path / 'released.npz', _released_names(flat))
  assert 'Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel' in np.load(path).files
  params, layout = read_npz(path)
  assert layout == 'released'
  _assert_same(params, flat)
  assert ('pre_logits' in params) == bool(overrides)


def test_linen_layout_loads_exactly(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=1)
  params, layout = read_npz(_write(tmp_path / 'linen.npz', flat))
  assert layout == 'linen'
  _assert_same(params, flat)


def test_hybrid_released_layout_squeezes_groupnorm(tmp_path):
  flat = _random_flat('R+ViT-Ze/4', size=32, channels=3, **HYBRID)
  assert flat['block2/unit1/gn_proj/scale'].shape == (512,)
  assert flat['gn_root/bias'].shape == (64,)
  stored = _released_names(flat)
  assert stored['block1/unit1/gn3/scale'].shape == (1, 1, 1, 256)
  params, layout = read_npz(_write(tmp_path / 'hybrid.npz', stored))
  assert layout == 'released'
  _assert_same(params, flat)  # every GN param back to [C]
  # A file that already has [C] GN params loads unchanged.
  _assert_same(load_npz(_write(tmp_path / 'hybrid_linen.npz', flat)), flat)


@pytest.mark.parametrize('prefix', ['params/', 'params/img/'])
def test_big_vision_layout_loads_exactly(tmp_path, prefix):
  flat = _random_flat('ViT-Ze/4', seed=2)
  stored = _big_vision(flat, prefix)
  assert stored[prefix + 'pos_embedding'].shape == (1, 49, 32)
  if prefix == 'params/img/':  # a two-tower file: the text tower and temperature are dropped
    stored['params/txt/head/kernel'] = np.ones((3, 3), np.float32)
    stored['params/t'] = np.ones((1,), np.float32)
  params, layout = read_npz(_write(tmp_path / 'bv.npz', stored))
  assert layout == prefix.rstrip('/') + ' big_vision'
  want = dict(flat)
  want[POSEMB] = np.concatenate([np.zeros((1, 1, 32), np.float32), flat[POSEMB][:, 1:]], axis=1)
  _assert_same(params, want)
  assert not params['Transformer']['posembed_input']['pos_embedding'][0, 0].any()


def test_big_vision_gap_posemb_is_taken_as_is(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=3, classifier='gap')
  assert 'cls' not in flat and flat[POSEMB].shape == (1, 49, 32)
  params = load_npz(_write(tmp_path / 'bv_gap.npz', _big_vision(flat)))
  _assert_same(params, flat)


def test_big_vision_scanned_encoder_is_unstacked(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=4)
  stored = {k: v for k, v in _big_vision(flat).items() if 'encoderblock_' not in k}
  for key in [k for k in flat if k.startswith('Transformer/encoderblock_0/')]:
    rest = key[len('Transformer/encoderblock_0/'):]
    stored['params/Transformer/encoderblock/' + rest] = np.stack(
        [flat[f'Transformer/encoderblock_{i}/{rest}'] for i in range(2)])
  params, layout = read_npz(_write(tmp_path / 'bv_scan.npz', stored))
  assert layout == 'params big_vision (scanned)'
  want = dict(flat)
  want[POSEMB] = np.concatenate([np.zeros((1, 1, 32), np.float32), flat[POSEMB][:, 1:]], axis=1)
  _assert_same(params, want)


def test_old_optimizer_checkpoint(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=5)
  stored = {'opt/target/' + k: v for k, v in _released_names(flat).items()}
  stored['opt/state/step'] = np.array(7)
  stored['opt/state/param_states/head/kernel/momentum'] = np.ones((32, 10), np.float32)
  params, layout = read_npz(_write(tmp_path / 'opt.npz', stored))
  assert layout == 'opt/target released'
  _assert_same(params, flat)


def test_mixed_layout_is_an_error(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=6)
  stored = dict(flat)
  stored['Transformer/encoderblock_0/LayerNorm_2/scale'] = flat[
      'Transformer/encoderblock_0/LayerNorm_1/scale']
  with pytest.raises(UserError, match=r'two arrays for Transformer/encoderblock_0/LayerNorm_1/'):
    load_npz(_write(tmp_path / 'mixed.npz', stored))


# ---------------------------------------------------------------------------------------------
# big_vision layout computes the same function (independent numpy forward).


def _ln(x, p, name, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p[name + '/scale'] + p[name + '/bias']


def _bv_forward(p, images, patch, layers):
  """big_vision ViT (pool 'tok'): x = [cls; patches @ W + b + pos_embedding] -> blocks -> head."""
  p = {k: v.astype(np.float64) for k, v in p.items()}
  b, h, w, c = images.shape
  x = images.astype(np.float64).reshape(b, h // patch, patch, w // patch, patch, c)
  x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // patch) * (w // patch), patch * patch * c)
  x = x @ p['embedding/kernel'].reshape(patch * patch * c, -1) + p['embedding/bias']
  x = x + p['pos_embedding']
  x = np.concatenate([np.broadcast_to(p['cls'], (b, 1, x.shape[-1])), x], axis=1)
  for i in range(layers):
    blk = f'Transformer/encoderblock_{i}/'
    att = blk + 'MultiHeadDotProductAttention_0/'
    y = _ln(x, p, blk + 'LayerNorm_0')
    q, k, v = (np.einsum('bnd,dhe->bnhe', y, p[att + n + '/kernel']) + p[att + n + '/bias']
               for n in ('query', 'key', 'value'))
    logits = np.einsum('bqhe,bkhe->bhqk', q, k) / np.sqrt(q.shape[-1])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum('bhqk,bkhe->bqhe', weights, v)
    x = x + np.einsum('bqhe,hed->bqd', y, p[att + 'out/kernel']) + p[att + 'out/bias']
    y = _ln(x, p, blk + 'LayerNorm_1')
    y = y @ p[blk + 'MlpBlock_0/Dense_0/kernel'] + p[blk + 'MlpBlock_0/Dense_0/bias']
    y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))  # tanh GELU
    x = x + y @ p[blk + 'MlpBlock_0/Dense_1/kernel'] + p[blk + 'MlpBlock_0/Dense_1/bias']
  x = _ln(x, p, 'Transformer/encoder_norm')[:, 0]
  return x @ p['head/kernel'] + p['head/bias']


def test_big_vision_layout_gives_the_same_logits(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=7)
  stored = _big_vision(flat, prefix='')  # an unprefixed big_vision file (top-level pos_embedding)
  stored['cls'] = stored['cls'] + 1.  # make cls clearly differ from any posemb row
  images = np.random.RandomState(8).uniform(-1, 1, (2, 28, 28, 1)).astype(np.float32)
  want = _bv_forward(stored, images, patch=4, layers=2)

  params, layout = read_npz(_write(tmp_path / 'bv.npz', stored))
  assert layout == 'big_vision'
  model = create_model('ViT-Ze/4', num_classes=10)
  got = np.asarray(model.apply({'params': params}, jnp.asarray(images), train=False))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert np.abs(want).max() > 0.5  # the comparison is not between near-zero logits

  # The test can tell: a cls posemb row other than zeros (e.g. the first patch row, the old-ViT
  # reading of a length-N posemb) changes the logits well beyond the tolerance.
  wrong = _flat(params)
  wrong[POSEMB] = np.concatenate([stored['pos_embedding'][:, :1], stored['pos_embedding']], 1)
  bad = np.asarray(model.apply({'params': _nested(wrong)}, jnp.asarray(images), train=False))
  assert np.abs(bad - want).max() > 1e-2


# ---------------------------------------------------------------------------------------------
# Saving.

CASES = {
    'vit': ('ViT-Ze/4', 28, 1, {}),
    'i21k': ('ViT-Ze/4', 28, 1, dict(representation_size=32)),
    'hybrid': ('R+ViT-Ze/4', 32, 3, HYBRID),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_save_writes_released_layout_and_round_trips(tmp_path, case):
  name, size, channels, overrides = CASES[case]
  flat = _random_flat(name, size, channels, seed=9, **overrides)
  path = str(tmp_path / 'out.npz')
  save_npz(path, _nested(flat))

  with np.load(path, allow_pickle=False) as stored:
    stored = {k: stored[k] for k in stored.files}
  expected_file = _released_names(flat)
  assert sorted(stored) == sorted(expected_file)
  for k, v in expected_file.items():
    assert stored[k].dtype == v.dtype and stored[k].tobytes() == v.tobytes() and (
        stored[k].shape == v.shape), k
  for key in ('Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel',
              'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel',
              'Transformer/encoderblock_1/LayerNorm_2/scale',
              'Transformer/encoderblock_1/LayerNorm_0/bias', POSEMB, 'cls', 'head/kernel'):
    assert key in stored, key
  assert not any('MultiHeadDotProductAttention_0' in k or 'MlpBlock_0' in k or
                 'LayerNorm_1' in k for k in stored)
  assert ('pre_logits/kernel' in stored) == (case == 'i21k')
  if case == 'hybrid':
    assert stored['gn_root/scale'].shape == (1, 1, 1, 64)
    assert stored['block2/unit1/gn_proj/bias'].shape == (1, 1, 1, 512)
    assert stored['block1/unit1/conv2/kernel'].shape == (3, 3, 64, 64)

  params, layout = read_npz(path)
  assert layout == 'released'
  _assert_same(params, flat)
  assert os.listdir(tmp_path) == ['out.npz']  # no temp file left behind


def test_save_accepts_jax_arrays_variables_and_bfloat16(tmp_path):
  flat = _random_flat('ViT-Ze/4', seed=10)
  tree = {'params': jax.tree.map(lambda v: jnp.asarray(v, jnp.bfloat16), _nested(flat))}
  path = str(tmp_path / 'bf16.npz')
  save_npz(path, tree)
  want = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in flat.items()}
  _assert_same(load_npz(path), want)


def test_save_is_atomic(tmp_path, monkeypatch):
  path = str(tmp_path / 'ckpt.npz')
  old = _random_flat('ViT-Ze/4', seed=11)
  save_npz(path, _nested(old))
  before = open(path, 'rb').read()

  def crash(f, *args, **kwargs):
    f.write(b'PK\x03\x04 half of a zip')
    raise KeyboardInterrupt('simulated crash while writing')

  monkeypatch.setattr(np, 'savez', crash)
  with pytest.raises(KeyboardInterrupt):
    save_npz(path, _nested(_random_flat('ViT-Ze/4', seed=12)))
  assert open(path, 'rb').read() == before
  assert os.listdir(tmp_path) == ['ckpt.npz']
  monkeypatch.undo()
  _assert_same(load_npz(path), old)


def test_save_to_missing_directory_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match='does not exist'):
    save_npz(str(tmp_path / 'no' / 'such' / 'dir.npz'), _nested(_random_flat('ViT-Ze/4')))


def test_remote_paths_go_through_gfile():
  flat = _random_flat('ViT-Ze/4', seed=13)
  path = 'ram://vit_jax_test_npz/ckpt.npz'
  save_npz(path, _nested(flat))
  _assert_same(load_npz(path), flat)
  with pytest.raises(UserError, match='ram://vit_jax_test_npz/missing.npz does not exist'):
    load_npz('ram://vit_jax_test_npz/missing.npz')


# ---------------------------------------------------------------------------------------------
# Unusable files.


class _Exploit:
  """Unpickling this would create the file named `marker`."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, 'w'))


def _valid_bytes(tmp_path):
  path = _write(tmp_path / 'valid.npz', _released_names(_random_flat('ViT-Ze/4', seed=14)))
  data = open(path, 'rb').read()
  os.remove(path)
  return data


def _corrupt_member(data):
  """Flip bytes in the array data of the first zip member (stored, so the CRC check fails)."""
  info = zipfile.ZipFile(io.BytesIO(data)).infolist()[0]
  start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
  at = start + info.compress_size - 8  # inside the array bytes, after the .npy header
  return data[:at] + bytes(255 - b for b in data[at:at + 4]) + data[at + 4:]


def _npz_bytes(**arrays):
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def _npy_bytes():
  buf = io.BytesIO()
  np.save(buf, np.ones((2, 3), np.float32))
  return buf.getvalue()


def _zip_bytes():
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, 'w') as z:
    z.writestr('README.txt', 'not params')
  return buf.getvalue()


NOT_ZIP = 'is not an .npz file (not a zip archive)'
BAD_FILES = {
    'zip_not_npz': (lambda d: _zip_bytes(), 'README.txt is not an .npy array'),
    'truncated_half': (lambda d: d[:len(d) // 2], 'is corrupt or truncated'),
    'truncated_end': (lambda d: d[:-10], 'is corrupt or truncated'),
    'corrupt_member': (_corrupt_member, 'is corrupt or truncated'),
    'random_bytes': (lambda d: np.random.RandomState(0).bytes(5000), NOT_ZIP),
    'text': (lambda d: b'Transformer/encoder_norm/scale = 1.0\n', NOT_ZIP),
    'pickle': (lambda d: pickle.dumps({'head/kernel': np.ones(3)}), NOT_ZIP),
    'empty': (lambda d: b'', 'is empty'),
    'npy': (lambda d: _npy_bytes(), 'is a single .npy array'),
    'strings': (lambda d: _npz_bytes(cls=np.array(['a', 'b'])), 'non-numeric array cls'),
    'no_arrays': (lambda d: _npz_bytes(), 'holds no arrays'),
}


@pytest.mark.parametrize('kind', sorted(BAD_FILES))
def test_unusable_files_give_one_line_user_errors(tmp_path, kind):
  make, message = BAD_FILES[kind]
  path = tmp_path / f'{kind}.npz'
  path.write_bytes(make(_valid_bytes(tmp_path)))
  with pytest.raises(UserError) as e:
    load_npz(str(path))
  text = str(e.value)
  assert message in text and str(path) in text and '\n' not in text, text


def test_pickled_object_array_is_refused_and_never_unpickled(tmp_path):
  marker = tmp_path / 'pwned'
  path = tmp_path / 'evil.npz'
  np.savez(path, **{'head/kernel': np.ones((2, 2), np.float32),
                    'head/bias': np.array([_Exploit(str(marker))], dtype=object)})
  with pytest.raises(UserError, match=r'pickled object array under head/bias') as e:
    load_npz(str(path))
  assert '\n' not in str(e.value)
  assert not marker.exists()


def test_missing_path_and_directory(tmp_path):
  with pytest.raises(UserError, match=r'nope\.npz does not exist: check the path'):
    load_npz(str(tmp_path / 'nope.npz'))
  with pytest.raises(UserError, match='is a directory'):
    load_npz(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Checking against a model.


@pytest.mark.slow
def test_checkpoint_of_another_model_names_first_mismatch(tmp_path):
  path = str(tmp_path / 'ze.npz')
  save_npz(path, _nested(_random_flat('ViT-Ze/4', seed=15)))
  model = create_model('ViT-Mu/4', num_classes=10)
  with pytest.raises(UserError) as e:
    load_for_model(path, model, (28, 28, 1), name='ViT-Mu/4')
  text = str(e.value)
  assert '\n' not in text
  # Ze: 2 layers, width 32, MLP 64; Mu: 6 layers, width 64, MLP 256. Every one of the 40 shared
  # keys differs except head/bias (10); blocks 2..5 (16 keys each) are missing.
  assert text.startswith('checkpoint does not fit ViT-Mu/4: embedding/kernel has shape '
                         '(4, 4, 1, 32) in the file but (4, 4, 1, 64) in the model; '
                         '38 more mismatches; missing from the file: 64 keys '
                         '(Transformer/encoderblock_2/LayerNorm_0/scale, '), text
  assert 'in the file but not in the model' not in text


@pytest.mark.slow
def test_big_models_mismatch_via_eval_shape():
  b16 = _abstract('ViT-B/16', 224, 3, num_classes=1000)
  s16 = _abstract('ViT-S/16', 224, 3, num_classes=1000)
  with pytest.raises(UserError) as e:
    check_params(b16, s16, what='ViT-S/16')
  text = str(e.value)
  assert text.startswith('checkpoint does not fit ViT-S/16: embedding/kernel has shape '
                         '(16, 16, 3, 768) in the file but (16, 16, 3, 384) in the model; ')
  assert '; 198 more mismatches. ' in text  # all 200 keys but head/bias
  query = lambda tree: {'q': tree['Transformer']['encoderblock_0'][
      'MultiHeadDotProductAttention_0']['query']}
  with pytest.raises(UserError, match=r'q/kernel has shape \(768, 12, 64\) in the file but '
                                      r'\(384, 6, 64\) in the model; 1 more mismatch\.'):
    check_params(query(b16), query(s16), what='ViT-S/16')
  check_params(b16, {'params': b16})  # equal trees (and flax variables) pass


def test_missing_and_unexpected_keys_are_listed():
  flat = _random_flat('ViT-Ze/4', seed=16)
  loaded = {k: v for k, v in flat.items() if not k.startswith('head/')}
  loaded['MAPHead_0/probe'] = np.zeros((1, 1, 32), np.float32)
  loaded['foo/bar'] = np.zeros(3, np.float32)
  loaded['foo/baz'] = np.zeros(3, np.float32)
  loaded['foo/qux'] = np.zeros(3, np.float32)
  with pytest.raises(UserError) as e:
    check_params(_nested(loaded), _abstract('ViT-Ze/4', 28, 1), what='ViT-Ze/4')
  text = str(e.value)
  assert '\n' not in text and 'has shape' not in text
  assert 'missing from the file: 2 keys (head/kernel, head/bias)' in text, text
  assert ('in the file but not in the model: 4 keys (MAPHead_0/probe, foo/bar, foo/baz, ...)'
          in text), text


def test_hints_for_head_and_pre_logits(tmp_path):
  path = str(tmp_path / 'i21k.npz')
  save_npz(path, _nested(_random_flat('ViT-Ze/4', seed=17, num_classes=21,
                                      representation_size=32)))
  model = create_model('ViT-Ze/4', num_classes=21)
  with pytest.raises(UserError, match=r'^checkpoint does not fit the VisionTransformer \(hidden '
                                      r'32, 2 layers, patch \(4, 4\), 21 classes\): in the file '
                                      r'but not in the model: 2 keys \(pre_logits/kernel, '
                                      r'pre_logits/bias\)\. To fix: .*representation_size'):
    load_for_model(path, model, (28, 28, 1))
  model = create_model('ViT-Ze/4', num_classes=10, representation_size=32)
  with pytest.raises(UserError, match=r'head/kernel has shape \(32, 21\) in the file but '
                                      r'\(32, 10\) in the model; 1 more mismatch\. To fix: the '
                                      r'number of classes differs; .*drop head/'):
    load_for_model(path, model, (28, 28, 1))


def test_hint_for_another_image_size(tmp_path):
  path = str(tmp_path / 'ze28.npz')
  save_npz(path, _nested(_random_flat('ViT-Ze/4', seed=19)))
  with pytest.raises(UserError, match=rf'{POSEMB} has shape \(1, 50, 32\) in the file but '
                                      r'\(1, 65, 32\) in the model\. To fix: .*another image size'):
    load_for_model(path, create_model('ViT-Ze/4', num_classes=10), (32, 32, 1))


def test_load_for_model_returns_the_tree_in_the_model_dtype(tmp_path):
  flat = _random_flat('R+ViT-Ze/4', size=32, channels=3, seed=18, **HYBRID)
  path = str(tmp_path / 'hybrid.npz')
  save_npz(path, _nested(flat))
  params = load_for_model(path, create_model('R+ViT-Ze/4', num_classes=10, **HYBRID),
                          (2, 32, 32, 3))
  _assert_same(params, flat)
  model = create_model('R+ViT-Ze/4', num_classes=10, param_dtype='bfloat16', **HYBRID)
  params = load_for_model(path, model, (32, 32, 3))
  assert {v.dtype for v in _flat(params).values()} == {np.dtype(ml_dtypes.bfloat16)}
  assert np.array_equal(params['gn_root']['scale'].astype(np.float32),
                        flat['gn_root/scale'].astype(ml_dtypes.bfloat16).astype(np.float32))
