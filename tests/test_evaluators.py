"""Evaluators: the few-shot closed-form solver on features with known answers, and ImageNet ReaL."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

from vit_jax import parallel
from vit_jax.data import specs
from vit_jax.data.offline_info import OfflineDatasetInfo
from vit_jax.errors import UserError
from vit_jax.evaluate import fewshot, real


# ---------------------------------------------------------------- few-shot solver


@pytest.mark.parametrize('n, d', [(40, 6), (6, 40)])  # primal and dual forms
def test_fit_ridge_equals_augmented_least_squares(n, d):
  rng = np.random.default_rng(0)
  x, y, k, l2 = rng.normal(size=(n, d)) + 3.0, rng.integers(0, 4, n), 4, 0.7
  weights, bias = fewshot.fit_ridge(x, y, k, l2)
  # Independent reference: min |x W + b - T|^2 + l2 |W|^2 (b not penalised) as one lstsq.
  t = 2 * np.eye(k)[y] - 1
  a = np.block([[x, np.ones((n, 1))], [np.sqrt(l2) * np.eye(d), np.zeros((d, 1))]])
  ref, *_ = np.linalg.lstsq(a, np.concatenate([t, np.zeros((d, k))]), rcond=None)
  np.testing.assert_allclose(weights, ref[:d], atol=1e-8)
  np.testing.assert_allclose(bias, ref[d], atol=1e-8)


def test_separable_classes_give_100_percent_and_random_features_give_chance():
  rng = np.random.default_rng(1)
  k, d = 10, 32
  centres = 5.0 * rng.normal(size=(k, d))
  def sample(n):
    y = rng.integers(0, k, n)
    return centres[y] + 0.3 * rng.normal(size=(n, d)), y
  train_x, train_y = sample(400)
  test_x, test_y = sample(2000)
  acc = fewshot.fewshot_accuracies(train_x, train_y, test_x, test_y, shots=(1, 5, 10, 25),
                                   num_classes=k, l2_reg=1.0)
  assert acc == {1: 1.0, 5: 1.0, 10: 1.0, 25: 1.0}
  # Features unrelated to the labels: accuracy at chance (1/10) within sampling error.
  noise_train, noise_test = rng.normal(size=(400, d)), rng.normal(size=(4000, d))
  acc = fewshot.fewshot_accuracies(noise_train, train_y, noise_test, rng.integers(0, k, 4000),
                                   shots=(5, 25), num_classes=k, l2_reg=1.0)
  for value in acc.values():
    assert abs(value - 0.1) < 0.025, acc


def test_first_per_class_is_nested_and_in_order():
  labels = np.array([2, 0, 0, 1, 2, 0, 1, 2, 0])
  np.testing.assert_array_equal(fewshot.first_per_class(labels, 1), [0, 1, 3])
  np.testing.assert_array_equal(fewshot.first_per_class(labels, 2), [0, 1, 2, 3, 4, 6])
  assert len(fewshot.first_per_class(labels, 9)) == len(labels)  # fewer than asked: all of them
  with pytest.raises(UserError, match='l2_reg'):
    fewshot.fit_ridge(np.zeros((2, 2)), np.array([0, 1]), 2, -1.0)


# ---------------------------------------------------------------- ImageNet ReaL


class VitTestReal(tfds.core.GeneratorBasedBuilder):
  """imagenet2012_real's features on 13 gray images whose brightness encodes the class (0..3)."""

  name = 'vit_test_real'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Test data.'}
  # (predicted class, real label set) per image; the model below predicts the image's class.
  ROWS = [(0, [0]), (1, [1, 2]), (2, [1]), (3, []), (0, [3]), (1, [1]), (2, [2, 3]), (3, [3]),
          (0, []), (1, [0, 2]), (2, [0, 1, 2, 3]), (3, [0]), (0, [0, 1])]

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(__file__)

  def _info(self):
    return OfflineDatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(None, None, 3)),
        'original_label': tfds.features.ClassLabel(num_classes=4),
        'real_label': tfds.features.Sequence(tfds.features.ClassLabel(num_classes=4)),
    }), supervised_keys=('image', 'real_label'))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'validation': self._generate_examples()}

  def _generate_examples(self):
    for i, (cls, labels) in enumerate(self.ROWS):
      image = np.full((10, 12, 3), 40 + 60 * cls, np.uint8)
      yield i, {'image': image, 'original_label': cls, 'real_label': labels}


class BrightnessModel:
  """Predicts the class whose brightness is closest (an analytic stand-in for a network)."""
  num_classes = 4

  def apply(self, variables, images, train):
    del variables, train
    level = (jnp.mean(images, axis=(1, 2, 3)) * 127.5 + 127.5 - 40) / 60  # 0..3
    return -jnp.abs(level[:, None] - jnp.arange(4)[None])


def test_real_hits_counts_predictions_in_the_label_set():
  logits = jnp.eye(4)[jnp.array([1, 2, 0])]
  sets = jnp.array([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
  out = real.real_hits(logits, sets, jnp.ones(3))
  assert float(out['correct']) == 1.0 and float(out['count']) == 2.0  # empty set not scored


def test_real_evaluator_on_a_tiny_builder(data_dir):
  VitTestReal(data_dir=data_dir).download_and_prepare()
  mesh = parallel.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1)))
  evaluator = real.RealEvaluator(
      model=BrightnessModel(), mesh=mesh, param_shardings=None, dataset='vit_test_real',
      data_dir=data_dir, split='validation', batch_size=8,
      spec=specs.eval_spec('resize', 8))
  result = evaluator({})
  scored = [(p, s) for p, s in VitTestReal.ROWS if s]
  expected = np.mean([p in s for p, s in scored])
  assert result['count'] == len(scored) == 11
  np.testing.assert_allclose(result['accuracy'], expected)
  assert 0 < expected < 1
  with pytest.raises(UserError, match='classes'):
    bigger = BrightnessModel()
    bigger.num_classes = 1000
    real.RealEvaluator(model=bigger, mesh=mesh, param_shardings=None, dataset='vit_test_real',
                       data_dir=data_dir, split='validation', batch_size=8,
                       spec=specs.eval_spec('resize', 8))
  with pytest.raises(UserError, match="has no 'image' image with a 'real_label'"):
    real.RealEvaluator(model=BrightnessModel(), mesh=mesh, param_shardings=None,
                       dataset='mnist5k', data_dir=data_dir, split='test', batch_size=8,
                       spec=specs.eval_spec('resize', 8))


@pytest.mark.parametrize('split', ['train', 'train[:90%]'])
def test_fewshot_pool_is_the_first_images_of_each_class_in_read_order(split):
  """The few-shot training images of mnist5k, read in place like every source: the first 5 of
  each class in the order tfds reads the split (catalog.py), in that order."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import catalog, pipeline  # pylint: disable=g-import-not-at-top
  images, labels = catalog.in_read_order('mnist5k', split)
  keep = fewshot.first_per_class(labels, 5)
  records = pipeline.source_records(data.get_info('mnist5k', None), split, cache=False)
  pool = list(fewshot._pool_records(records, 5, 10).as_numpy_iterator())  # pylint: disable=protected-access
  assert len(pool) == len(keep) == 50
  np.testing.assert_array_equal(labels[keep], [label for _, label in pool])
  np.testing.assert_array_equal(images[keep], np.stack([image for image, _ in pool]))


# ---------------------------------------------------------------- the registry


def _config(**values):
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4,batch_size=16')
  config.warmup_steps = 1  # below the 4 steps (checked by the validation)
  config.update(values)
  return config


def test_config_evals_entries_are_checked_before_anything_is_built():
  """An unknown type lists the registered ones; an unknown option names its key; option values
  are checked by the type; `every` is a step count; 'train' is the train metrics' split. Each
  is one line naming the key."""
  from vit_jax.train import validate  # pylint: disable=g-import-not-at-top
  validate.check_config(_config())
  cases = [
      (('knn', 'type', 'rael'), r"^unknown evaluator type 'rael' in config.evals.knn.type: use "
       r'one of fewshot, knn, linear_probe, real, robustness, top1, vtab \(or register one: '
       r'docs/evaluation.md\)$'),
      (('knn', 'kk', 3), r'^config.evals.knn.kk is not an option of evaluator type knn: use '
       r'dataset, train_split, eval_split, k, temperature, weighting \(or every\)$'),
      (('knn', 'k', 0), r'^config.evals.knn.k=0 must be at least 1'),
      (('knn', 'weighting', 'gauss'), r"^config.evals.knn.weighting='gauss': use one of exp, "
       r'uniform$'),
      (('linear_probe', 'holdout', 1.0), r'^config.evals.linear_probe.holdout=1.0 must be a '
       r'fraction between 0 and 1'),
      (('linear_probe', 'l2_grid', ()), r'^config.evals.linear_probe.l2_grid=\(\) must be one '
       r'or more L2 strengths'),
      (('fewshot', 'shots', (0, 5)), r'^config.evals.fewshot.shots=\(0, 5\) must be positive'),
      (('fewshot', 'every', -1), r'^config.evals.fewshot.every=-1 must be a number of steps'),
  ]
  for (name, key, value), message in cases:
    config = _config()
    config.evals[name][key] = value
    with pytest.raises(UserError, match=message):
      validate.check_config(config)
  config = _config()
  config.evals.train = dict(type='top1')
  with pytest.raises(UserError, match=r"^config.evals.train: 'train' is the train metrics"):
    validate.check_config(config)
  config = _config()
  config.evals.extra = dict(k=3)
  with pytest.raises(UserError, match=r'^config.evals.extra must be an entry with a type'):
    validate.check_config(config)


def test_naming_an_entry_is_enough_and_every_is_its_schedule():
  """The entries that run in training are those with `every` > 0 or unset (= eval_every), by
  name; overriding an entry's `every` switches it on, nothing else to list."""
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config = _config()
  config.eval_every = 7
  run = registry.Run(config, model=None, mesh=None, param_shardings=None, data=None, eval_pp={},
                     eval_fn=lambda params, batch: None)
  config.evals.eval.split = 'test[:8]'
  built = registry.periodic_evaluators
  names = lambda c: [(e.name, e.type, e.every) for e in built(c, run)]
  assert names(config)[:1] == [('eval', 'top1', 7)] and len(names(config)) == 1
  config.evals.knn.every = 500
  assert names(config) == [('eval', 'top1', 7), ('knn', 'knn', 500)]


def test_a_registered_evaluator_is_built_with_its_options_and_run_when_due():
  """A test's own evaluator type: registered, given an entry with an option, built once with the
  run's context, called at its steps and the last; an entry with every=0 is not built."""
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  built = []

  @registry.register('count_test')
  def count_test(run, start=0):  # pylint: disable=unused-variable
    """Counts its calls."""
    built.append((run.config.dataset, run.data, start))
    calls = []
    return registry.Evaluation(
        lambda params: {'calls': float(start + len(calls.append(params) or calls))})

  try:
    config = _config()
    config.evals = ml_collections.ConfigDict({'counter': dict(type='count_test', every=2,
                                                              start=10)})
    registry.check(config)
    run = registry.Run(config, model=None, mesh=None, param_shardings=None, data='info',
                       eval_pp={})
    evaluators = registry.periodic_evaluators(config, run)
    assert built == [('mnist5k', 'info', 10)]
    assert [(e.name, e.every) for e in evaluators] == [('counter', 2)]
    due = [(step, e.name, metrics) for step in range(1, 6) for e, metrics in
           registry.run_due(evaluators, step, step == 5, lambda: 'params')]
    assert due == [(2, 'counter', {'calls': 11.0}), (4, 'counter', {'calls': 12.0}),
                   (5, 'counter', {'calls': 13.0})]
    config.evals.counter.every = 0
    assert registry.periodic_evaluators(config, run) == []
  finally:
    registry.EVALUATORS.unregister('count_test')
  with pytest.raises(UserError, match="unknown evaluator type 'count_test'"):
    registry.check(config)


def test_the_evaluate_command_resolves_entries_types_and_suites():
  """`--evals` names: an entry of config.evals (its options), a registered type (its defaults),
  a suite (its members); an unknown name lists all three kinds."""
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config = _config()
  config.evals.knn.k = 5
  registry.register_suite('suite_test', ('knn', 'top1'))
  try:
    resolved = registry.resolve(config, ['suite_test', 'linear_probe'])
    assert list(resolved) == ['knn', 'top1', 'linear_probe']
    assert resolved['knn'][0].keywords['k'] == 5 and resolved['top1'][0].keywords == {}
    with pytest.raises(UserError, match=r"^unknown evaluator 'knm': use one of eval, fewshot, "
                                        r'knn, linear_probe, real, robustness, suite_test, '):
      registry.resolve(config, ['knm'])
    with pytest.raises(ValueError, match='registered twice'):
      registry.register_suite('suite_test', ())
  finally:
    del registry.SUITES['suite_test']
