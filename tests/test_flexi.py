"""FlexiViT (vit_jax/models/flexi.py): the pseudo-inverse resize of the patch kernel, the flexible
model against the plain ViT, and its options' checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import flexi
from vit_jax.models import vit


def _patchwise_resize(images: np.ndarray, p: int, q: int) -> np.ndarray:
  """Every p x p patch of `images` [B, H, W, C] bilinearly resized (jax.image.resize) to q x q."""
  b, h, w, c = images.shape
  patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  resized = jax.image.resize(jnp.asarray(patches), (b, h // p, w // p, q, q, c), 'bilinear',
                             antialias=False)
  return np.asarray(resized).transpose(0, 1, 3, 2, 4, 5).reshape(b, h // p * q, w // p * q, c)


def test_bilinear_matrix_is_jax_image_resize_without_antialiasing():
  # Up and down: the half-pixel bilinear resize of tf.image.resize (big_vision's choice).
  for n_in, n_out in ((4, 7), (8, 3), (5, 5), (3, 12), (12, 5)):
    basis = jnp.eye(n_in)[:, :, None, None]  # n_in signals of length n_in
    resized = jax.image.resize(basis, (n_in, n_out, 1, 1), 'bilinear', antialias=False)
    np.testing.assert_allclose(flexi.bilinear_matrix(n_in, n_out),
                               np.asarray(resized)[..., 0, 0].T, atol=1e-6)


@pytest.mark.parametrize('p, q', [(4, 4), (4, 6), (4, 7), (4, 8), (3, 10)])
def test_pi_resized_kernel_gives_the_same_tokens_on_the_resized_image(p, q):
  """The defining property (FlexiViT paper, Sec. 3.4): <x, w> = <B x, w'> for q >= p."""
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(p, p, 3, 5)).astype(np.float32)
  images = rng.uniform(-1, 1, size=(2, 3 * p, 2 * p, 3)).astype(np.float32)
  conv = lambda x, k, s: jax.lax.conv_general_dilated(
      jnp.asarray(x), k, (s, s), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=jax.lax.Precision.HIGHEST)
  tokens = conv(images, jnp.asarray(kernel), p)
  resized_kernel = flexi.pi_resize_kernel(jnp.asarray(kernel), (q, q))
  assert resized_kernel.shape == (q, q, 3, 5)
  resized_tokens = conv(_patchwise_resize(images, p, q), resized_kernel, q)
  np.testing.assert_allclose(resized_tokens, tokens, rtol=1e-4, atol=1e-4)


def test_pi_resize_is_the_pseudo_inverse_of_the_full_resize_matrix():
  """Resizing one axis at a time equals pinv(B^T) w with B the whole 2-D resize (non-square)."""
  rng = np.random.default_rng(1)
  kernel = rng.normal(size=(4, 5, 2, 3))
  for new in ((7, 3), (2, 8)):
    full = np.linalg.pinv(flexi.resize_matrix((4, 5), new).T)  # [new h*w, 4*5]
    expected = np.einsum('ai,icd->acd', full, kernel.reshape(20, 2, 3)).reshape(*new, 2, 3)
    got = flexi.pi_resize_kernel(jnp.asarray(kernel, jnp.float32), new)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _plain_and_flexi_params(classifier='token'):
  """Params of ViT-Ze/4 at 28 px (7x7 grid) and the same params as FlexiViT (a 4x4 kernel, a 7x7
  position-embedding grid); the plain model's cls position row is zero, as FlexiViT's."""
  plain = models.create_model('ViT-Ze/4', num_classes=3, classifier=classifier)
  params = plain.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 3)), train=False)['params']
  params = jax.tree.map(np.array, params)
  pe = params['Transformer']['posembed_input']['pos_embedding']
  has_cls = vit.has_cls(classifier)
  params['head']['kernel'] = np.random.default_rng(0).normal(
      size=params['head']['kernel'].shape).astype(np.float32)  # non-zero logits
  if has_cls:
    pe[:, 0] = 0.
  flexi_params = jax.tree.map(lambda x: x, params)
  flexi_params['Transformer']['posembed_input'] = {'pos_embedding': pe[:, int(has_cls):]}
  return plain, params, flexi_params


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_flexi_model_at_its_stored_patch_size_is_the_plain_vit(classifier):
  plain, params, flexi_params = _plain_and_flexi_params(classifier)
  model = models.create_model('ViT-Ze/4', num_classes=3, classifier=classifier, flexi_patch=4,
                              flexi_grid=7)
  x = jax.random.uniform(jax.random.PRNGKey(1), (2, 28, 28, 3), minval=-1, maxval=1)
  shapes = jax.tree.map(np.shape, model.init(jax.random.PRNGKey(0), x, train=False)['params'])
  assert shapes == jax.tree.map(np.shape, flexi_params)
  expected = plain.apply({'params': params}, x, train=False)
  got = model.apply({'params': flexi_params}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(expected).max()) > 1e-2


def test_flexi_model_at_another_patch_size_is_the_plain_vit_on_resized_params():
  """ViT-Ze/7 with a stored 4x4 kernel and 7x7 grid (28 px: a 4x4 grid) equals the plain ViT-Ze/7
  whose kernel is pinv(B^T) w (B from resizing basis patches) and whose position embedding is
  the stored grid resized by jax.image.resize."""
  _, _, flexi_params = _plain_and_flexi_params('token')
  kernel = flexi_params['embedding']['kernel']  # [4, 4, 3, 32]
  basis = np.eye(16).reshape(16, 4, 4, 1)
  b = np.asarray(jax.image.resize(jnp.asarray(basis), (16, 7, 7, 1), 'bilinear',
                                  antialias=False)).reshape(16, 49).T  # [49, 16]: x' = B x
  resized_kernel = (np.linalg.pinv(b.T) @ kernel.reshape(16, -1)).reshape(7, 7, 3, 32)
  grid = flexi_params['Transformer']['posembed_input']['pos_embedding'].reshape(1, 7, 7, 32)
  resized_pe = np.asarray(jax.image.resize(jnp.asarray(grid), (1, 4, 4, 32), 'bilinear'))
  reference = jax.tree.map(lambda x: x, flexi_params)
  reference['embedding']['kernel'] = resized_kernel.astype(np.float32)
  reference['Transformer']['posembed_input'] = {'pos_embedding': np.concatenate(
      [np.zeros((1, 1, 32), np.float32), resized_pe.reshape(1, 16, 32)], axis=1)}
  x = jax.random.uniform(jax.random.PRNGKey(2), (2, 28, 28, 3), minval=-1, maxval=1)
  expected = models.create_model('ViT-Ze/7', num_classes=3).apply(
      {'params': reference}, x, train=False)
  model = models.create_model('ViT-Ze/7', num_classes=3, flexi_patch=4, flexi_grid=7)
  got = model.apply({'params': flexi_params}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('options, error', [
    (dict(flexi_patch=-1), 'model.flexi_patch=-1 is out of range: it must be an integer >= 0'),
    (dict(flexi_grid=2.5), 'model.flexi_grid=2.5 is out of range: it must be an integer >= 0'),
    (dict(flexi_resize='area'), "unknown flexi_resize 'area': use model.flexi_resize= one of"),
    (dict(flexi_grid=7, posemb='sincos2d'),
     "model.flexi_grid=7 resizes a learned position embedding but model.posemb='sincos2d'"),
])
def test_bad_flexi_options_are_one_line_errors(options, error):
  with pytest.raises(UserError, match='^' + error.replace('(', r'\(').replace('.', r'\.')):
    models.create_model('ViT-Ze/4', num_classes=3, **options)
