"""MLP-Mixer (vit_jax/models/mixer.py): parameter counts and tree of the released models (the
original repository's `models_mixer.py`), the forward pass against numpy, .npz files one to one."""

import jax
import numpy as np
import pytest

from vit_jax.errors import UserError
from vit_jax.formats import npz
from vit_jax.models import VARIANTS, create_model
from vit_jax.models import cost
from vit_jax.serving import bundle as bundle_lib

# Exact counts at 224 px, 1000 classes; they round to the Mixer paper's Table 1 (millions).
COUNT_224_1K = {
    'Mixer-S/32': 19_104_624,
    'Mixer-S/16': 18_528_264,
    'Mixer-B/32': 60_293_428,
    'Mixer-B/16': 59_880_472,
    'Mixer-L/32': 206_939_264,
    'Mixer-L/16': 208_196_168,
}
PAPER_MILLIONS = {'Mixer-S/32': 19, 'Mixer-S/16': 18, 'Mixer-B/32': 60, 'Mixer-B/16': 59,
                  'Mixer-L/32': 206, 'Mixer-L/16': 208}


def _shapes(name, size=224, classes=1000):
  model = create_model(name, num_classes=classes)
  x = np.zeros((1, size, size, 3), np.float32)
  return jax.tree.map(lambda s: s.shape, jax.eval_shape(
      lambda: model.init(jax.random.key(0), x, train=False))['params'])


def _closed_form(name, size=224, classes=1000):
  """The count from the architecture: stem, per block two LayerNorms and two MLPs, the head."""
  m = create_model(name, num_classes=classes)
  p, d, t, c = m.patch[0], m.hidden_size, m.tokens_mlp_dim, m.channels_mlp_dim
  n = (size // p) ** 2
  block = 4 * d + (n * t + t + t * n + n) + (d * c + c + c * d + d)
  return p * p * 3 * d + d + m.num_layers * block + 2 * d + d * classes + classes


def test_every_released_size_is_registered_and_pinned():
  assert {v for v in VARIANTS if v.startswith('Mixer-')} == set(COUNT_224_1K) | {'Mixer-Ze/4'}


@pytest.mark.parametrize('name', sorted(COUNT_224_1K))
def test_param_count_224_1k(name):
  count = sum(int(np.prod(s)) for s in jax.tree.leaves(_shapes(name), is_leaf=lambda x:
                                                        isinstance(x, tuple)))
  assert count == COUNT_224_1K[name] == _closed_form(name)
  assert int(count / 1e6) == PAPER_MILLIONS[name]


def test_param_tree_is_the_originals():
  shapes = _shapes('Mixer-B/16')
  assert set(shapes) == {*(f'MixerBlock_{i}' for i in range(12)), 'head',
                         'pre_head_layer_norm', 'stem'}
  assert shapes['stem'] == {'kernel': (16, 16, 3, 768), 'bias': (768,)}
  assert shapes['MixerBlock_0'] == {
      'LayerNorm_0': {'scale': (768,), 'bias': (768,)},
      'token_mixing': {'Dense_0': {'kernel': (196, 384), 'bias': (384,)},
                       'Dense_1': {'kernel': (384, 196), 'bias': (196,)}},
      'LayerNorm_1': {'scale': (768,), 'bias': (768,)},
      'channel_mixing': {'Dense_0': {'kernel': (768, 3072), 'bias': (3072,)},
                         'Dense_1': {'kernel': (3072, 768), 'bias': (768,)}}}
  assert shapes['head'] == {'kernel': (768, 1000), 'bias': (1000,)}


def _tiny():
  model = create_model('Mixer-Ze/4', num_classes=5)
  images = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
  params = model.init(jax.random.key(0), images, train=False)['params']
  rng = np.random.RandomState(1)
  return model, images, jax.tree.map(lambda a: np.asarray(a) + 0.1 * rng.normal(size=a.shape),
                                     params)


def _np_forward(p, x):
  """The original's forward pass in numpy float64 (tanh GELU, LayerNorm eps 1e-6)."""
  def ln(v, q):
    mu = v.mean(-1, keepdims=True)
    return (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * q['scale'] + \
        q['bias']
  gelu = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
  mlp = lambda v, q: gelu(v @ q['Dense_0']['kernel'] + q['Dense_0']['bias']) @ \
      q['Dense_1']['kernel'] + q['Dense_1']['bias']
  b = x.shape[0]
  k = p['stem']['kernel']
  patches = x.reshape(b, 7, 4, 7, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(b, 49, -1)
  h = patches @ k.reshape(-1, k.shape[-1]) + p['stem']['bias']
  i = 0
  while f'MixerBlock_{i}' in p:
    q = p[f'MixerBlock_{i}']
    h = h + mlp(ln(h, q['LayerNorm_0']).swapaxes(1, 2), q['token_mixing']).swapaxes(1, 2)
    h = h + mlp(ln(h, q['LayerNorm_1']), q['channel_mixing'])
    i += 1
  return ln(h, p['pre_head_layer_norm']).mean(1) @ p['head']['kernel'] + p['head']['bias']


def test_forward_is_the_originals_and_npz_files_load_one_to_one(tmp_path):
  model, images, params = _tiny()
  logits = np.asarray(model.apply({'params': params}, images, train=False))
  want = _np_forward(jax.tree.map(lambda a: np.asarray(a, np.float64), params), images)
  assert np.abs(want).max() > 0.1
  np.testing.assert_allclose(logits, want, atol=1e-4 * np.abs(want).max())
  path = str(tmp_path / 'Mixer-Ze_4.npz')
  npz.save_npz(path, params)
  bundle = bundle_lib.from_params_file(path, model_name='Mixer-Ze/4')
  assert (bundle.spec.image_size, bundle.spec.channels, bundle.spec.options) == (28, 3, {})
  np.testing.assert_allclose(bundle.spec.build().apply({'params': bundle.params}, images,
                                                       train=False), logits, atol=1e-6)


def test_cost_and_bad_inputs():
  model = create_model('Mixer-B/16', num_classes=1000)
  # Multiply-adds of Mixer-B/16 at 224 px (196 patches, width 768): the stem 196*768*768, per block
  # the token MLP 2*768*196*384 and the channel MLP 2*196*768*3072, the head 768*1000.
  macs = 196 * 768 * 768 + 12 * (2 * 768 * 196 * 384 + 2 * 196 * 768 * 3072) + 768 * 1000
  assert cost.forward_flops(model, (224, 224, 3)) == 2 * macs == 25_203_535_872
  with pytest.raises(UserError, match='image size 30x30 is not divisible by the patch size 4'):
    create_model('Mixer-Ze/4', num_classes=2).init(jax.random.key(0), np.zeros((1, 30, 30, 3)),
                                                   train=False)
  with pytest.raises(UserError, match=r'model.num_heads=3 does not apply to Mixer-Ze/4 \(a '
                                      r'MlpMixer'):
    create_model('Mixer-Ze/4', num_classes=2, num_heads=3)
  with pytest.raises(UserError, match=r"unknown model 'Mixer-H/14'.*Mixer-<base>/<patch>"):
    create_model('Mixer-H/14', num_classes=2)


def test_the_released_mixers_by_name_and_their_files_checked_as_mixers(tmp_path, monkeypatch):
  """The four released files of gs://mixer_models (B/16, L/16 pre-trained on ImageNet-1k and
  ImageNet-21k) by name; a file served under a name is checked by the Mixer's own names (its final
  norm's width, its MixerBlock count)."""
  from vit_jax.formats import weights  # pylint: disable=g-import-not-at-top
  mixers = {n: w for n, w in weights.KNOWN.items() if n.startswith('Mixer-')}
  assert {n: weights.url(w) for n, w in mixers.items()} == {
      f'Mixer-{s}/16@{src}': f'https://storage.googleapis.com/mixer_models/{src}/Mixer-{s}_16.npz'
      for s in 'BL' for src in ('imagenet1k', 'imagenet21k')}
  monkeypatch.setenv(weights.URL_VAR, f'file://{tmp_path / "mirror"}')
  monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
  served = tmp_path / 'mirror' / 'mixer_models' / 'imagenet1k' / 'Mixer-B_16.npz'
  served.parent.mkdir(parents=True)
  # The names check_model reads, at Mixer-B/16's width and depth (not its 60M parameters).
  np.savez(served, **{'pre_head_layer_norm/scale': np.ones(768, np.float32)},
           **{f'MixerBlock_{i}/LayerNorm_0/scale': np.ones(768, np.float32) for i in range(12)})
  path = weights.fetch('Mixer-B/16@imagenet1k')
  assert path == str(tmp_path / 'cache' / 'mixer_models' / 'imagenet1k' / 'Mixer-B_16.npz')
  weights.check_model('Mixer-B/16@imagenet1k', path)  # the right model: no error
  _, _, params = _tiny()
  npz.save_npz(path, params)  # a Mixer-Ze/4 under the name
  with pytest.raises(UserError, match=r'holds another model \(width 32, 2 blocks\), not '
                     r'Mixer-B/16@imagenet1k \(Mixer-B/16: width 768, 12 blocks\)'):
    weights.check_model('Mixer-B/16@imagenet1k', path)
