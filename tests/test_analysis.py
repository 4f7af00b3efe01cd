"""vit_jax.analysis: the numbers behind the four figures, a short real training run, and the CLI.

Expected values are computed independently here (plain numpy loops), never by the code under test.
"""

import fcntl
import itertools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax.configs import mnist5k
from vit_jax import analysis
from vit_jax.analysis import inputs
from vit_jax.checkpoint import train_ckpt
from vit_jax.errors import UserError
from vit_jax.models import create_model
from helpers import ROOT, optimized

# One worker runs this module, so its shared fixtures are computed once per test run.
pytestmark = pytest.mark.xdist_group('analysis')

FIGURES = ('embedding_filters', 'posemb_similarity', 'attention_distance', 'attention_rollout')


def _softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def _random_attention(rng, layers=3, batch=2, heads=4, tokens=10):
  return _softmax(rng.normal(size=(layers, batch, heads, tokens, tokens)) * 2)


# ---------------------------------------------------------------------------------------------
# Attention rollout.


def test_rollout_of_identity_attention_is_identity():
  attn = np.broadcast_to(np.eye(50), (6, 2, 4, 50, 50))
  rollout = analysis.rollout_matrix(attn)
  np.testing.assert_allclose(rollout, np.broadcast_to(np.eye(50), (2, 50, 50)), atol=1e-6)
  # The cls row keeps all its mass on cls: nothing lands on the patches. GAP: each patch is
  # its own pooled input, so the mean row is uniform.
  np.testing.assert_allclose(analysis.attention_rollout(attn, True, (7, 7)), 0., atol=1e-6)
  gap = analysis.attention_rollout(np.broadcast_to(np.eye(49), (6, 2, 4, 49, 49)), False, (7, 7))
  assert gap.shape == (2, 7, 7)
  np.testing.assert_allclose(gap, 1 / 49, rtol=1e-5)


def test_rollout_rows_sum_to_one_and_follow_the_recipe():
  rng = np.random.default_rng(0)
  attn = _random_attention(rng)
  rollout = analysis.rollout_matrix(attn)
  assert rollout.shape == (2, 10, 10)
  assert (rollout >= 0).all()
  np.testing.assert_allclose(rollout.sum(-1), 1., atol=1e-5)
  # By hand: per layer 0.5 * mean_heads(A) + 0.5 * I (rows of A sum to 1), product from layer 1.
  expected = np.eye(10)
  for layer in attn[:, 1]:
    expected = (0.5 * layer.mean(0) + 0.5 * np.eye(10)) @ expected
  np.testing.assert_allclose(rollout[1], expected, atol=1e-5)
  maps = analysis.attention_rollout(attn[..., :10, :10], True, (3, 3))
  np.testing.assert_allclose(maps[1].reshape(-1), expected[0, 1:], atol=1e-5)
  gap = analysis.attention_rollout(attn[..., 1:, 1:] / attn[..., 1:, 1:].sum(-1, keepdims=True),
                                   False, (3, 3))
  np.testing.assert_allclose(gap.sum(axis=(1, 2)), 1., atol=1e-5)  # a mean of rows of sum 1


# ---------------------------------------------------------------------------------------------
# Mean attention distance.


def _mean_pair_distance(grid, sy, sx):
  """Mean centre distance over all ordered pairs of patches, itself included (numpy loops)."""
  cells = list(itertools.product(range(grid[0]), range(grid[1])))
  total = sum(np.hypot((r1 - r2) * sy, (c1 - c2) * sx) for (r1, c1), (r2, c2) in
              itertools.product(cells, cells))
  return total / len(cells) ** 2


@pytest.mark.parametrize('grid,pixels,has_cls', [((7, 7), 4, True), ((3, 5), (2, 3), False),
                                                  ((14, 14), 16, True)])
def test_uniform_attention_gives_the_grid_mean_distance(grid, pixels, has_cls):
  patches = grid[0] * grid[1]
  n = patches + int(has_cls)
  attn = np.full((2, 3, 2, n, n), 1. / n)
  if has_cls:  # whatever the cls token gets is dropped and the patch weights renormalised
    attn[..., 0] = 0.7
    attn[..., 1:] = 0.3 / patches
  sy, sx = (pixels, pixels) if np.isscalar(pixels) else pixels
  expected = _mean_pair_distance(grid, sy, sx)
  got = analysis.mean_attention_distance(attn, grid, pixels)
  assert got.shape == (2, 2)  # [layers, heads]
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  np.testing.assert_allclose(analysis.uniform_attention_distance(grid, pixels), expected, rtol=1e-6)


def test_local_attention_distances():
  grid, p = (4, 6), 4.
  n = 24
  self_attn = np.broadcast_to(np.eye(n), (1, 1, 1, n, n))
  np.testing.assert_allclose(analysis.mean_attention_distance(self_attn, grid, p), 0., atol=1e-6)
  # Every patch looks one step sideways (right, or left in the last column): exactly p pixels.
  side = np.zeros((n, n))
  for q in range(n):
    side[q, q + 1 if q % grid[1] < grid[1] - 1 else q - 1] = 1.
  diag = np.zeros((n, n))  # one step diagonally down-right (up-left in the last row/column)
  for q in range(n):
    r, c = divmod(q, grid[1])
    dr = 1 if r < grid[0] - 1 else -1
    dc = 1 if c < grid[1] - 1 else -1
    diag[q, (r + dr) * grid[1] + c + dc] = 1.
  attn = np.stack([side, diag])[None, None]  # [1 layer, 1 image, 2 heads, n, n]
  np.testing.assert_allclose(analysis.mean_attention_distance(attn, grid, p),
                             [[p, p * np.sqrt(2)]], rtol=1e-6)


def test_distance_rejects_a_token_count_that_does_not_fit_the_grid():
  with pytest.raises(ValueError, match='grid'):
    analysis.mean_attention_distance(np.ones((1, 1, 1, 48, 48)) / 48, (7, 7), 4)


# ---------------------------------------------------------------------------------------------
# Position-embedding similarity and embedding PCA.


def test_posemb_similarity_is_cosine_over_patch_positions():
  rng = np.random.default_rng(1)
  pe = rng.normal(size=(1, 50, 64)).astype(np.float32)
  pe[0, 0] *= 100  # the cls slot must not take part
  params = {'Transformer': {'posembed_input': {'pos_embedding': pe}}}
  sim = analysis.posemb_similarity(params, (7, 7), has_cls=True)
  assert sim.shape == (49, 49)
  np.testing.assert_allclose(np.diag(sim), 1., atol=1e-6)
  np.testing.assert_allclose(sim, sim.T, atol=1e-7)
  i, j = 3, 40
  a, b = pe[0, 1 + i], pe[0, 1 + j]
  np.testing.assert_allclose(sim[i, j], a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-5)
  gap = analysis.posemb_similarity(pe[:, 1:], (7, 7), has_cls=False)  # GAP: no cls slot
  np.testing.assert_allclose(gap, sim, atol=1e-6)
  with pytest.raises(ValueError, match='grid'):
    analysis.posemb_similarity(params, (7, 7), has_cls=False)


def test_sincos_posemb_is_most_similar_to_a_neighbour():
  params = {'embedding': {'bias': np.zeros(64)}}
  sim = analysis.posemb_similarity(params, (7, 7), has_cls=True, posemb='sincos2d')
  np.testing.assert_allclose(np.diag(sim), 1., atol=1e-5)
  assert analysis.neighbour_fraction(sim, (7, 7), connectivity=4) == 1.0


def test_neighbour_helpers():
  grid = (3, 4)
  assert analysis.interior_positions(grid).tolist() == [5, 6]
  assert analysis.is_grid_neighbour(5, 1, grid, 4) and analysis.is_grid_neighbour(5, 0, grid, 8)
  assert not analysis.is_grid_neighbour(5, 0, grid, 4) and not analysis.is_grid_neighbour(5, 5, grid)
  assert not analysis.is_grid_neighbour(3, 4, grid)  # row-major wrap-around is not adjacent
  sim = np.eye(12)
  sim[5, 11], sim[6, 7] = 0.9, 0.9  # 5 -> 11 is two rows down; 6 -> 7 is a 4-neighbour
  sim = np.maximum(sim, sim.T)
  assert analysis.most_similar_other(sim)[[5, 6]].tolist() == [11, 7]
  assert analysis.neighbour_fraction(sim, grid, 8, positions=[5, 6]) == 0.5


@pytest.mark.parametrize('shape,expected_n', [((4, 4, 3, 64), 28), ((4, 4, 1, 64), 16),
                                              ((16, 16, 3, 40), 28)])
def test_embedding_pca_components_are_orthonormal(shape, expected_n):
  rng = np.random.default_rng(2)
  kernel = rng.normal(size=shape) * np.linspace(0.1, 2, shape[-1])  # distinct variances
  pca = analysis.embedding_pca({'embedding': {'kernel': kernel}}, n=28)
  assert pca.components.shape == (expected_n,) + shape[:3]
  flat = pca.components.reshape(expected_n, -1).astype(np.float64)
  np.testing.assert_allclose(flat @ flat.T, np.eye(expected_n), atol=1e-5)
  ratio = pca.explained_variance_ratio
  assert (np.diff(ratio) <= 1e-7).all() and 0 < ratio.sum() <= 1 + 1e-6
  # The first component is the top eigenvector of the filters' covariance (computed with eigh).
  filters = kernel.reshape(-1, shape[-1]).T
  values, vectors = np.linalg.eigh(np.cov(filters, rowvar=False))
  np.testing.assert_allclose(abs(flat[0] @ vectors[:, -1]), 1., atol=1e-4)
  np.testing.assert_allclose(ratio[0], values[-1] / values.sum(), rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Attention weights of real models; report on hand-made checkpoints (hybrid, GAP).


def _init(model, size=28):
  init = jax.jit(lambda key: model.init(key, np.zeros((1, size, size, 1), np.float32), train=False))
  return init(jax.random.key(0))['params']


@pytest.mark.slow
def test_attention_weights_of_a_model():
  model = create_model('ViT-Ze/4', num_classes=3)
  x = np.random.default_rng(3).uniform(-1, 1, (3, 28, 28, 1)).astype(np.float32)
  params = _init(model)
  logits, attn = analysis.forward_with_attention(model, params, x, batch_size=2)
  assert analysis.token_grid(model, 28) == (7, 7)
  assert attn.shape == (2, 3, 2, 50, 50) and logits.shape == (3, 3)  # [L, B, H, N, N]
  np.testing.assert_allclose(attn.sum(-1), 1., atol=1e-5)
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False,
                                           mutable=['intermediates']))
  _, state = apply(params, x[2:])  # the last image went through in a batch of its own
  sown = state['intermediates']['Transformer']['encoderblock_1'][
      'MultiHeadDotProductAttention_0']['attention_weights'][0]
  np.testing.assert_allclose(attn[1, 2:], sown, atol=1e-6)


def _save_checkpoint(workdir, model_name, classifier, data_dir, step=3):
  config = mnist5k.get_config(f'model_name={model_name}')
  config.model.classifier = classifier
  config.data_dir = data_dir
  params = _init(create_model(model_name, num_classes=10, classifier=classifier))
  ckpt = train_ckpt.Checkpointer(str(workdir), keep=2)
  ckpt.save(step, {'params': params, 'step': np.int32(step)}, config.to_dict())
  ckpt.close()
  return params


def _write_png(path, rgb=True, size=(40, 30)):
  rng = np.random.default_rng(4)
  Image.fromarray(rng.integers(0, 255, size + ((3,) if rgb else ()), dtype=np.uint8)).save(path)
  return str(path)


@pytest.mark.slow
def test_report_for_a_gap_hybrid_on_image_files(tmp_path, data_dir):
  params = _save_checkpoint(tmp_path / 'run', 'R+ViT-Ze/4', 'gap', data_dir)
  pngs = [_write_png(tmp_path / 'a.png'), _write_png(tmp_path / 'b.png', rgb=False)]
  out = tmp_path / 'out'
  summary = analysis.write_report(workdir=str(tmp_path / 'run'), out=str(out), images=pngs)
  for name in FIGURES:
    assert (out / f'{name}.png').stat().st_size > 1000
  rollout = np.load(out / 'attention_rollout.npz')
  assert rollout['images'].shape == (2, 28, 28, 1)  # resized to the model's input and channels
  assert rollout['maps'].shape == (2, 7, 7)
  np.testing.assert_allclose(rollout['maps'].sum(axis=(1, 2)), 1., atol=1e-5)  # GAP: all patches
  filters = np.load(out / 'embedding_filters.npz')
  assert str(filters['source']) == 'conv_root'  # the pixel-facing filters of the hybrid
  assert filters['components'].shape == (28, 7, 7, 1)  # 7x7 root conv, 64 filters
  assert filters['embedding_components'].shape[1:3] == (1, 1)  # patch 1 on the stem's features
  sim = np.load(out / 'posemb_similarity.npz')['similarity']
  np.testing.assert_allclose(sim, analysis.posemb_similarity(params, (7, 7), False), atol=1e-6)
  assert summary['patch_pixels'] == [4.0, 4.0]  # effective stride: 28 px / 7 patches
  distance = np.load(out / 'attention_distance.npz')
  assert distance['mean_distance'].shape == (2, 2)  # [layers, heads] of R+ViT-Ze/4
  assert distance['per_image'].shape == (2, 2, 2)


def test_user_errors(tmp_path):
  with pytest.raises(UserError, match='does not exist'):
    inputs.resolve_checkpoint(str(tmp_path / 'nowhere'))
  with pytest.raises(UserError, match='no checkpoints'):
    inputs.resolve_checkpoint(str(tmp_path))
  with pytest.raises(UserError, match='missing --workdir'):
    inputs.resolve_checkpoint(None)
  for step in ('5', '12'):  # finished steps hold state/ and config/
    for item in ('state', 'config'):
      (tmp_path / 'run' / 'checkpoints' / step / item).mkdir(parents=True)
  (tmp_path / 'run' / 'checkpoints' / '20.orbax-checkpoint-tmp-1' / 'state').mkdir(parents=True)
  (tmp_path / 'run' / 'checkpoints' / '30' / 'state').mkdir(parents=True)  # unfinished
  assert inputs.available_steps(tmp_path / 'run') == [5, 12]
  assert inputs.resolve_checkpoint(str(tmp_path / 'run')).name == '12'  # newest, not '5' < '12'
  assert inputs.resolve_checkpoint(str(tmp_path / 'run'), '5').name == '5'
  with pytest.raises(UserError, match='available steps are 5, 12'):
    inputs.resolve_checkpoint(str(tmp_path / 'run'), '7')
  with pytest.raises(UserError, match='not a checkpoint step directory'):
    inputs.resolve_checkpoint(None, str(tmp_path))
  assert inputs.resolve_checkpoint(None, str(tmp_path / 'run/checkpoints/5/state')).name == '5'
  (tmp_path / 'notes.png').write_text('not an image')
  with pytest.raises(UserError, match='cannot decode image .*notes.png'):
    inputs.load_image_files([str(tmp_path / 'notes.png')], 28, 1)
  with pytest.raises(UserError, match='cannot read image .*missing.png'):
    inputs.load_image_files([str(tmp_path / 'missing.png')], 28, 1)


@pytest.mark.slow
def test_cli_bad_input_is_one_line(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'analyze', f'--workdir={tmp_path}/nope',
                         f'--out={tmp_path}/out'], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: ') and 'nope' in lines[0], proc.stderr


# ---------------------------------------------------------------------------------------------
# A short real training run of the `make train` model (shared by the xdist workers).

SHORT_STEPS = 150


@pytest.fixture(scope='session')
def short_run(tmp_path_factory, data_dir):
  """Workdir of ViT-Mu/4 trained SHORT_STEPS steps on mnist5k (trained once per test run)."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    base = base.parent  # shared by this test run's workers only
  workdir = base / f'analysis_vit_mu4_{SHORT_STEPS}'
  with open(base / 'analysis_short_run.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (workdir / 'checkpoints' / str(SHORT_STEPS)).is_dir():
      from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
      config = mnist5k.get_config(f'model_name=ViT-Mu/4,steps={SHORT_STEPS},batch_size=64')
      config.data_dir = data_dir
      config.warmup_steps = 10
      config.eval_every = config.checkpoint_every = config.log_every = SHORT_STEPS
      config.eval_split = 'test[:200]'
      config.progress = False
      with optimized():  # 150 steps: running, not compiling, is the time
        loop.train_and_evaluate(config, str(workdir))
    fcntl.flock(lock, fcntl.LOCK_UN)
  return str(workdir)


@pytest.mark.slow
def test_the_short_run_learns_mnist5k(short_run):
  """Training learns: chance is 0.1, and so is a model that does not learn (or learns images
  against the wrong labels); ViT-Mu/4 reaches 0.42 on test[:200] after the SHORT_STEPS steps."""
  with open(os.path.join(short_run, 'metrics.jsonl')) as f:
    (final,) = [r for r in map(json.loads, f) if r['split'] == 'eval']
  assert final['step'] == SHORT_STEPS and final['count'] == 200
  assert final['accuracy'] > 0.3, final


@pytest.mark.slow
def test_short_run_posemb_is_most_similar_to_neighbours(short_run):
  """The paper's Figure 7 centre: nearby patches get similar position embeddings.

  Asserted on the 7x7 grid of ViT-Mu/4 after SHORT_STEPS steps:
  (a) for at least 35 of the 49 positions, the mean cosine similarity to its 8-neighbours is
      higher than the mean similarity to all positions 2 or more steps away (Chebyshev);
  (b) for at least 17 of the 49 positions, the most similar other position is an 8-neighbour
      (random embeddings: 8/48 = 1/6 for an interior position, less on the border).
  Measured (of 49) after 150 steps with seeds 0/1/2/5: (a) 39/41/44/47, (b) 23/22/22/23 (LLVM at
  the suite's level 1, conftest.py: (a) 37/41/44/46, (b) 22/19/22/22); after
  100 steps (seeds 0/1/2) (b) drops to 12 for seed 1, so 150 is the smallest robust N tried.
  20 random N(0, 0.02) embeddings give (a) 12-34 and (b) 0-10; the 1600-step `make train` run
  gives (a) 48 and (b) 39. (The stricter "most interior positions have a neighbour as their
  argmax" needs ~800 steps here: 23/25 interior at 1600, 10-15/25 at 150.)
  """
  params, _ = inputs.load_checkpoint(inputs.resolve_checkpoint(short_run))
  sim = analysis.posemb_similarity(params, (7, 7), has_cls=True)
  rows, cols = np.divmod(np.arange(49), 7)
  steps = np.maximum(abs(rows[:, None] - rows[None]), abs(cols[:, None] - cols[None]))
  near = np.array([sim[i, steps[i] == 1].mean() for i in range(49)])
  far = np.array([sim[i, steps[i] >= 2].mean() for i in range(49)])
  assert np.sum(near > far) >= 35, (near - far).round(2)
  masked = np.where(np.eye(49, dtype=bool), -np.inf, sim)
  best = masked.argmax(axis=1)
  assert np.sum(steps[np.arange(49), best] == 1) >= 17, best


@pytest.mark.slow
def test_cli_end_to_end_on_the_short_run(short_run, tmp_path):
  out = tmp_path / 'figures'
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'analyze', f'--workdir={short_run}',
                         f'--out={out}', '--num_images=8'], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  for name in FIGURES:
    assert name in proc.stdout
    with Image.open(out / f'{name}.png') as image:
      assert image.format == 'PNG' and min(image.size) > 200
  params, _ = inputs.load_checkpoint(inputs.resolve_checkpoint(short_run))
  filters = np.load(out / 'embedding_filters.npz')
  np.testing.assert_allclose(filters['components'],
                             analysis.embedding_pca(params, 28).components, atol=1e-5)
  assert filters['components'].shape == (16, 4, 4, 1)  # grayscale 4x4 patches: 16 dimensions
  sim = np.load(out / 'posemb_similarity.npz')['similarity']
  np.testing.assert_allclose(sim, analysis.posemb_similarity(params, (7, 7), True), atol=1e-6)
  distance = np.load(out / 'attention_distance.npz')
  assert distance['mean_distance'].shape == (6, 4) and distance['per_image'].shape == (6, 8, 4)
  assert (distance['mean_distance'] > 0).all()
  assert (distance['mean_distance'] < np.hypot(24, 24)).all()  # farthest patch centres
  rollout = np.load(out / 'attention_rollout.npz')
  assert rollout['images'].shape == (8, 28, 28, 1) and rollout['maps'].shape == (8, 7, 7)
  assert rollout['labels'].shape == (8,)
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['checkpoint'].endswith(f'checkpoints/{SHORT_STEPS}')
