"""The representation evaluators against scikit-learn, the feature cache, and the results table."""

import json
import os

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from vit_jax.errors import UserError
from vit_jax.evaluate import features, knn, linear_probe, results


def _blobs(seed=0, n_train=400, n_test=200, classes=6, dim=16, spread=1.6):
  """Gaussian class clusters that overlap enough for k-NN and the probe to make mistakes."""
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(classes, dim))

  def draw(n):
    y = rng.integers(0, classes, n)
    return (centers[y] + spread * rng.normal(size=(n, dim))).astype(np.float32), y

  return (*draw(n_train), *draw(n_test), classes)


# ---------------------------------------------------------------- k-NN


@pytest.mark.parametrize('weighting', ['exp', 'uniform'])
def test_knn_predicts_as_sklearn_with_cosine_and_the_same_weights(weighting):
  """DINO's vote (weights exp(cosine similarity / T)) is sklearn's KNeighborsClassifier with the
  cosine metric and a callable weights= of the distance 1 - similarity; uniform is 'uniform'."""
  tx, ty, sx, sy, classes = _blobs()
  k, temperature = 10, 0.07
  weights = ((lambda d: np.exp((1.0 - d) / temperature)) if weighting == 'exp' else 'uniform')
  reference = KNeighborsClassifier(n_neighbors=k, metric='cosine', algorithm='brute',
                                   weights=weights).fit(tx, ty)
  votes = knn.knn_votes(tx, ty, sx, num_classes=classes, k=k, temperature=temperature,
                        weighting=weighting)
  np.testing.assert_array_equal(votes.argmax(1), reference.predict(sx))
  accuracy = knn.knn_accuracy(tx, ty, sx, sy, num_classes=classes, k=k, temperature=temperature,
                              weighting=weighting)
  assert accuracy['top1'] == pytest.approx(reference.score(sx, sy))
  assert 0.5 < accuracy['top1'] < 1.0 and accuracy['top1'] <= accuracy['top5']


def test_knn_vote_and_top5_by_hand():
  """Three training points on the unit circle; the test point nearest class 1's two points."""
  train = np.array([[1.0, 0.0], [0.0, 1.0], [0.1, 1.0], [-1.0, 0.0]])
  labels = np.array([0, 1, 1, 2])
  test = np.array([[0.2, 1.0]])
  votes = knn.knn_votes(train, labels, test, num_classes=7, k=3, temperature=1.0)
  sim = (train / np.linalg.norm(train, axis=1, keepdims=True)) @ (test[0] / np.linalg.norm(test))
  near = np.argsort(-sim)[:3]  # points 2, 1, 0
  expected = np.zeros(7)
  for i in near:
    expected[labels[i]] += np.exp(sim[i])
  np.testing.assert_allclose(votes[0], expected, rtol=1e-5)
  assert knn.topk_hits(votes, np.array([0]), 1).tolist() == [False]
  assert knn.topk_hits(votes, np.array([0]), 5).tolist() == [True]
  with pytest.raises(UserError, match=r'^k=0 must be at least 1'):
    knn.knn_votes(train, labels, test, num_classes=3, k=0)


# ---------------------------------------------------------------- linear probe


def test_linear_probe_equals_sklearn_logistic_regression_at_the_same_strength():
  """The probe's objective is sklearn's with C = 1 / (l2 n): the weights agree to 1e-3 and the
  test top-1 within 0.5 percentage points (float32 L-BFGS against sklearn's float64 lbfgs)."""
  tx, ty, sx, sy, classes = _blobs(seed=1)
  for l2 in (1e-3, 1e-1):
    w, b = linear_probe.fit(tx, ty, classes, l2, steps=300)
    reference = LogisticRegression(C=1.0 / (l2 * len(ty)), max_iter=5000, tol=1e-10).fit(tx, ty)
    np.testing.assert_allclose(w.T, reference.coef_, atol=1e-3)
    top1 = np.mean(linear_probe.predict(sx, w, b) == sy)
    assert abs(top1 - reference.score(sx, sy)) <= 0.005
    assert 0.5 < top1 < 1.0


def test_linear_probe_chooses_the_strength_on_the_held_out_part_then_refits():
  """A grid with one absurd strength (every weight pushed to 0: chance on the held-out part)
  picks the reasonable one; the refit uses all training examples."""
  tx, ty, sx, sy, classes = _blobs(seed=2)
  fit_part, held = linear_probe.holdout_split(len(ty), 0.2)
  assert len(held) == len(ty) // 5 and not set(fit_part) & set(held)
  best, scores = linear_probe.choose_l2(tx, ty, classes, (1e3, 1e-2), holdout=0.2, steps=100)
  assert best == 1e-2 and scores[1e-2] > scores[1e3] + 0.2
  out = linear_probe.probe_accuracy(tx, ty, sx, sy, num_classes=classes, l2_grid=(1e3, 1e-2),
                                    steps=100)
  w, b = linear_probe.fit(tx, ty, classes, 1e-2, steps=100)
  assert out['l2'] == 1e-2 and out['top1'] == np.mean(linear_probe.predict(sx, w, b) == sy)
  with pytest.raises(UserError, match=r'^holdout=0 must be a fraction'):
    linear_probe.probe_accuracy(tx, ty, sx, sy, num_classes=classes, holdout=0)


# ---------------------------------------------------------------- feature cache


class _Counting:
  """An extractor whose features are the batch's images flattened; stops after `stop` calls."""

  def __init__(self, stop=None):
    self.calls, self.stop = 0, stop

  def batch(self, params, batch):
    del params
    if self.stop is not None and self.calls == self.stop:
      raise KeyboardInterrupt
    self.calls += 1
    keep = batch['mask'] > 0
    return batch['image'].reshape(len(keep), -1)[keep], batch['label'][keep]


def _batches(n=7):
  rng = np.random.default_rng(0)
  out = []
  for i in range(n):
    mask = np.ones(4, np.float32)
    if i == n - 1:
      mask[2:] = 0  # the last batch is padded
    out.append({'image': rng.normal(size=(4, 2, 2, 1)).astype(np.float32),
                'label': rng.integers(0, 3, 4), 'mask': mask})
  return out


def test_features_are_cached_per_chunk_and_a_stopped_extraction_resumes(tmp_path):
  """A signal during extraction keeps the chunks already written; the next run computes only
  the missing batches and returns what an uncached extraction does."""
  batches = _batches()
  identity = {'step': 10, 'content': 'abc'}
  cache = features.FeatureCache(str(tmp_path), identity, chunk_batches=2).for_data(
      {'name': 'd', 'fingerprint': 'f1'}, 'test', {'ops': 'resize'}, 4)
  with pytest.raises(KeyboardInterrupt):
    cache.extract(_Counting(stop=5), None, batches)
  assert sorted(os.listdir(cache.path)) == ['chunk_00000.npz', 'chunk_00001.npz']
  resumed = _Counting()
  x, y = cache.extract(resumed, None, batches)
  assert resumed.calls == 3  # batches 4, 5 and 6
  fresh = [_Counting().batch(None, b) for b in batches]
  np.testing.assert_array_equal(x, np.concatenate([f for f, _ in fresh]))
  np.testing.assert_array_equal(y, np.concatenate([l for _, l in fresh]))
  assert len(y) == 4 * 7 - 2
  again = _Counting()
  cache.extract(again, None, batches)
  assert again.calls == 0  # a full hit


def test_a_changed_checkpoint_or_dataset_is_other_data(tmp_path):
  data, pp = {'name': 'd', 'fingerprint': 'f1'}, {'ops': 'resize'}
  key = lambda ckpt, data, split='test', batch=8: features.FeatureCache(
      str(tmp_path), ckpt).for_data(data, split, pp, batch).key
  base = key({'step': 10, 'content': 'abc'}, data)
  assert base == key({'step': 10, 'content': 'abc'}, dict(data))
  assert len({base, key({'step': 10, 'content': 'abd'}, data),
              key({'step': 20, 'content': 'abc'}, data),
              key({'step': 10, 'content': 'abc'}, dict(data, fingerprint='f2')),
              key({'step': 10, 'content': 'abc'}, data, 'train'),
              key({'step': 10, 'content': 'abc'}, data, batch=16)}) == 6


# ---------------------------------------------------------------- results table


def test_the_results_table_is_written_and_read_back_for_the_same_checkpoint_only(tmp_path):
  ckpt = {'step': 3, 'path': '/r/checkpoints/3', 'content': 'c1'}
  table = {'knn': results.row('knn', {'k': 20}, {'name': 'mnist5k', 'fingerprint': 'f'},
                              {'top1': 0.9, 'top5': 0.99}, 1.23456)}
  results.save(str(tmp_path), ckpt, table)
  stored = json.loads((tmp_path / 'results.json').read_text())
  assert stored['format'] == 'vit_jax.evaluation' and stored['checkpoint'] == ckpt
  assert stored['results']['knn']['metrics'] == {'top1': 0.9, 'top5': 0.99}
  assert '| knn | knn | mnist5k (f) | top1 | 0.9000 |' in (tmp_path / 'results.md').read_text()
  finished = results.load(str(tmp_path), ckpt)
  assert results.done(finished, 'knn', 'knn', {'k': 20})
  assert not results.done(finished, 'knn', 'knn', {'k': 10})  # other options: rerun
  assert results.load(str(tmp_path), dict(ckpt, content='c2')) == {}  # another checkpoint
  assert results.plot(str(tmp_path), ckpt, table).endswith('results.png')


def test_command_options_replace_an_evaluators_own_and_are_checked():
  """`--option=NAME.OPTION=VALUE`: the value read as a literal where it is one, replacing the
  entry's (or the type's default); an option the type lacks, a name --evals does not run and a
  bad value are one line each, naming the flag."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4')
  config.evals.knn.k = 5
  from vit_jax import registry as shared  # pylint: disable=g-import-not-at-top
  assert shared.option_value('(1, 5)') == (1, 5)
  assert shared.option_value('dtd+svhn') == 'dtd+svhn'
  resolved = registry.resolve(config, ['knn', 'vtab'],
                              {'knn': {'k': 7}, 'vtab': {'tasks': 'svhn+dtd'}})
  assert resolved['knn'][0].keywords['k'] == 7 and resolved['knn'][0].keywords['weighting'] == 'exp'
  assert resolved['vtab'][0].keywords == {'tasks': 'svhn+dtd'}
  with pytest.raises(UserError, match=r"^--option=knn.kk=\.\.\.: 'kk' is not an option of "
                                      r'evaluator type knn: use dataset, train_split, '):
    registry.resolve(config, ['knn'], {'knn': {'kk': 1}})
  with pytest.raises(UserError, match=r"^--option=fewshot.shots=\.\.\.: 'fewshot' is not among "
                                      r'the evaluators --evals runs \(knn\)$'):
    registry.resolve(config, ['knn'], {'fewshot': {'shots': (1,)}})
  with pytest.raises(UserError, match=r'^--option=knn.k=0 must be'):
    registry.resolve(config, ['knn'], {'knn': {'k': 0}})
  with pytest.raises(UserError, match=r"^--option=vtab.overrides='total_stepz=2': 'total_stepz' "
                                      r'is not a config key of the fine-tuning recipe'):
    registry.resolve(None, ['vtab', 'eval'], {'vtab': {'overrides': 'total_stepz=2'}},
                     known_only=True)


def test_an_evaluator_that_trains_is_refused_during_training():
  """A vtab entry runs only in the evaluate command: every unset or > 0 is refused when the
  config is checked; every=0 passes."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4')
  config.evals.vtab = {'type': 'vtab', 'tasks': 'dtd'}
  with pytest.raises(UserError, match=r'^config.evals.vtab.every=None: type vtab trains runs of '
                                      r'its own, after training: give it every=0 and run python '
                                      r'-m vit_jax evaluate --evals=vtab$'):
    registry.check(config)
  config.evals.vtab.every = 0
  registry.check(config)


def test_image_size_is_refused_for_a_run_in_one_line(tmp_path):
  """--image_size sizes a params file given by --weights; a run's image size is its config's."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from helpers import ROOT  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'evaluate', f'--workdir={tmp_path}',
                         '--evals=knn', '--image_size=240'], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      "error: --image_size is for --weights (a params file whose position embedding does not "
      "give its image size, a FlexiViT's): a run's size is its config's"], proc.stderr
  assert list(tmp_path.iterdir()) == []  # nothing written
