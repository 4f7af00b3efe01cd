"""Register tokens (`model.num_registers`, vit_jax/models/vit.py): attended to in every block,
never reaching the head, the few-shot features or the attention figures; 0 is the original model.
The timm layout of register models is tested in tests/test_timm_layout.py and tests/interop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.analysis import attention as attention_lib
from vit_jax.errors import UserError
from vit_jax.evaluate import features as features_lib
from vit_jax.models import create_model
from vit_jax.models import options
from vit_jax.models import vit as vit_lib
from vit_jax.models.spec import infer_options

IMAGES = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)


def _init(model, seed=0):
  params = model.init(jax.random.key(seed), IMAGES[:1], train=False)['params']
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.RandomState(seed + 1)  # the head is born zero: move every leaf
  return jax.tree.unflatten(tree, [p + 0.1 * rng.normal(size=p.shape).astype(np.float32)
                                   for p in leaves])


def test_zero_registers_is_the_original_model():
  plain, zero = create_model('ViT-Ze/4', num_classes=3), create_model(
      'ViT-Ze/4', num_classes=3, num_registers=0)
  a = plain.init(jax.random.key(0), IMAGES[:1], train=False)
  b = zero.init(jax.random.key(0), IMAGES[:1], train=False)
  assert jax.tree.all(jax.tree.map(np.array_equal, a, b))
  assert vit_lib.num_prefix_tokens(plain) == 1
  assert vit_lib.num_prefix_tokens(create_model('ViT-Ze/4', num_classes=3, classifier='gap')) == 0


@pytest.mark.parametrize('classifier', ['token', 'gap', 'unpooled'])
def test_registers_are_attended_to_but_never_reach_the_head(classifier):
  model = create_model('ViT-Ze/4', num_classes=3, classifier=classifier, num_registers=2)
  params = _init(model)
  assert params['registers'].shape == (1, 2, 32)
  assert vit_lib.num_prefix_tokens(model) == (classifier != 'gap') + 2
  logits, state = model.apply({'params': params}, IMAGES, train=False,
                              capture_intermediates=True)
  tokens = state['intermediates']['Transformer']['__call__'][0]  # the encoder's output
  assert tokens.shape == (2, 49 + vit_lib.num_prefix_tokens(model), 32)
  kernel, bias = params['head']['kernel'], params['head']['bias']
  # What the head reads: cls (token 0), or the patches (tokens after cls and the registers).
  start = vit_lib.num_prefix_tokens(model)
  pooled = {'token': tokens[:, 0], 'gap': tokens[:, start:].mean(1),
            'unpooled': jnp.concatenate([tokens[:, :start - 2], tokens[:, start:]], 1)}
  np.testing.assert_allclose(logits, pooled[classifier] @ kernel + bias, atol=1e-5)
  # The registers take part: other register values give other logits.
  # (not a constant shift, which the LayerNorms remove)
  shift = np.random.RandomState(3).normal(size=params['registers'].shape).astype(np.float32)
  moved = {**params, 'registers': params['registers'] + shift}
  assert np.abs(model.apply({'params': moved}, IMAGES, train=False) - logits).max() > 1e-3


def test_features_and_attention_figures_leave_the_registers_out():
  model = create_model('ViT-Ze/4', num_classes=3, num_registers=4)
  params = _init(model)
  features = features_lib.feature_fn(model)(params, IMAGES)
  assert features.shape == (2, 32)
  logits, attn = attention_lib.forward_with_attention(model, params, IMAGES)
  assert attn.shape == (2, 2, 2, 50, 50)  # layers, images, heads, cls + 49 patches
  np.testing.assert_allclose(logits, model.apply({'params': params}, IMAGES, train=False),
                             atol=1e-5)
  # Rows and columns of cls and the patches, as the full [54, 54] weights have them.
  _, state = model.clone(attention='einsum').apply(
      {'params': params}, IMAGES, train=False, mutable=['intermediates'])
  full = state['intermediates']['Transformer']['encoderblock_0'][
      'MultiHeadDotProductAttention_0']['attention_weights'][0]
  keep = np.r_[0, 5:54]
  np.testing.assert_allclose(attn[0], np.asarray(full)[:, :, keep][:, :, :, keep], atol=1e-6)
  assert attention_lib.mean_attention_distance(attn, (7, 7), (4, 4)).shape == (2, 2)


def test_a_params_file_says_how_many_registers():
  model = create_model('ViT-Ze/4', num_classes=3, classifier='gap', num_registers=3)
  params = _init(model)
  assert infer_options(params) == {'classifier': 'gap', 'num_registers': 3}


@pytest.mark.parametrize('value', [-1, 1.5, True])
def test_bad_register_counts_are_one_line(value):
  with pytest.raises(UserError, match=rf'^model.num_registers={value!r} is out of range: it must '
                                      r'be an integer >= 0$'):
    options.check('ViT-Ze/4', {'num_registers': value})
  with pytest.raises(UserError, match='num_registers=2 does not apply to BiT-R14x0.5'):
    options.check('BiT-R14x0.5', {'num_registers': 2})
