"""The attention-pool head (`model.classifier='map'`, vit_jax/models/vit.py MAPHead): big_vision's
MAPHead computed in numpy on the encoder's output; timm parity in tests/interop."""

import jax
import numpy as np

from vit_jax.models import create_model
from vit_jax.models.spec import infer_options


def _layer_norm(x, p):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * p['scale'] + p['bias']


def _map_head(tokens, p, heads):
  """big_vision's MAPHead: probe attends to the tokens, then x + MLP(LN(x)); float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  att = p['MultiHeadDotProductAttention_0']
  proj = lambda x, name: np.einsum('...d,dhk->...hk', x, att[name]['kernel']) + att[name]['bias']
  q = proj(p['probe'], 'query')  # [1, 1, h, k]
  k, v = proj(tokens, 'key'), proj(tokens, 'value')  # [b, n, h, k]
  logits = np.einsum('qhk,bnhk->bhqn', q[0], k) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  y = np.einsum('bhqn,bnhk->bqhk', w, v)
  y = np.einsum('bqhk,hkd->bqd', y, att['out']['kernel']) + att['out']['bias']
  mlp = p['MlpBlock_0']
  z = _layer_norm(y, p['LayerNorm_0']) @ mlp['Dense_0']['kernel'] + mlp['Dense_0']['bias']
  z = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
  return (y + z @ mlp['Dense_1']['kernel'] + mlp['Dense_1']['bias'])[:, 0]


def test_map_head_is_big_visions_attention_pooling():
  model = create_model('ViT-Ze/4', num_classes=3, classifier='map', num_registers=2)
  images = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
  params = model.init(jax.random.key(0), images, train=False)['params']
  rng = np.random.RandomState(1)
  params = jax.tree.map(lambda a: np.asarray(a) + 0.1 * rng.normal(size=a.shape), params)
  assert 'cls' not in params and params['MAPHead_0']['probe'].shape == (1, 1, 32)
  logits, state = model.apply({'params': params}, images, train=False,
                              capture_intermediates=True)
  tokens = np.asarray(state['intermediates']['Transformer']['__call__'][0], np.float64)
  pooled = _map_head(tokens[:, 2:], params['MAPHead_0'], heads=2)  # registers left out
  want = pooled @ params['head']['kernel'] + params['head']['bias']
  np.testing.assert_allclose(logits, want, atol=1e-4 * np.abs(want).max())
  assert np.abs(want).max() > 0.1
  # The check can fail: pooling over the registers too gives other logits.
  wrong = _map_head(tokens, params['MAPHead_0'], heads=2) @ params['head']['kernel']
  assert np.abs(wrong + params['head']['bias'] - want).max() > 1e-3
  assert infer_options(params) == {'classifier': 'map', 'num_registers': 2}
