"""Few-shot linear evaluation, as the paper's ablations and scaling figures use it (ViT paper,
§4.1).

The frozen pre-logit features (what the head sees: the pooled token after the encoder norm, and
after the pre_logits layer if the model has one) of `shots` training images per class are mapped
to {-1, 1}^K targets by regularised least squares, solved in closed form; test images are
classified by the largest of the K outputs.

  W, b = fit_ridge(x_train, y_train, K, l2_reg)   argmin |x W + b - T|^2 + l2_reg |W|^2, with
                                                  T = 2 one_hot(y) - 1 and b not penalised
  accuracy(x_test, y_test, W, b)

Which training images: the first n of each class in the split's read order (tfds writes shuffled
shards; mnist5k and digits are read in the same order, catalog.py), so an n-shot set contains
every smaller one and the choice is the same on every run and any number of processes.
`FewShotEvaluator` reads and caches them once through the tf.data records of every source
(`pipeline.source_records`), then each call computes the features of those and of the whole eval
split with the given params (features.py: sharded over the mesh).
`python -m vit_jax fewshot` runs it on a checkpoint (`evaluate_checkpoint`).
"""

from typing import Callable, Dict, Optional, Sequence

import jax
import numpy as np

import tensorflow as tf

from vit_jax import data as data_lib
from vit_jax import errors
from vit_jax import parallel
from vit_jax.evaluate import features as features_lib
from vit_jax.data import pipeline
from vit_jax.data import specs
from vit_jax.data import streams
from vit_jax.errors import UserError
from vit_jax.parallel import sharding


# ---------------------------------------------------------------------------------------------
# The closed-form solver (pure numpy, float64).


def fit_ridge(features: np.ndarray, labels: np.ndarray, num_classes: int, l2_reg: float):
  """(W [d, K], b [K]) of the regularised least-squares map from features onto {-1, 1} targets."""
  if l2_reg < 0:
    raise UserError(f'fewshot.l2_reg={l2_reg} is negative: use a value >= 0, e.g. 1.0')
  x = np.asarray(features, np.float64)
  targets = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0
  x_mean, t_mean = x.mean(axis=0), targets.mean(axis=0)
  xc, tc = x - x_mean, targets - t_mean
  n, d = xc.shape
  if n < d:  # dual form: an n x n system instead of d x d (few shots, wide features)
    weights = xc.T @ np.linalg.solve(xc @ xc.T + l2_reg * np.eye(n), tc)
  else:
    weights = np.linalg.solve(xc.T @ xc + l2_reg * np.eye(d), xc.T @ tc)
  return weights, t_mean - x_mean @ weights


def predict(features: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
  return np.argmax(np.asarray(features, np.float64) @ weights + bias, axis=1)


def first_per_class(labels: np.ndarray, shots: int) -> np.ndarray:
  """Indices of the first `shots` examples of each class, in order."""
  labels = np.asarray(labels)
  return np.sort(np.concatenate(
      [np.flatnonzero(labels == c)[:shots] for c in np.unique(labels)]).astype(np.int64))


def fewshot_accuracies(train_x, train_y, test_x, test_y, *, shots: Sequence[int], num_classes: int,
                       l2_reg: float) -> Dict[int, float]:
  """{n: test accuracy of the map fit on the first n training examples of each class}."""
  out = {}
  for n in shots:
    chosen = first_per_class(train_y, n)
    weights, bias = fit_ridge(train_x[chosen], train_y[chosen], num_classes, l2_reg)
    out[int(n)] = float(np.mean(predict(test_x, weights, bias) == np.asarray(test_y)))
  return out


def _pool_records(records, max_shots: int, num_classes: int):
  """The first `max_shots` records of each class of `records` ((stored image or record key, label)
  in read order, `pipeline.split_records`), in that order, cached."""

  def keep(counts, record):
    label = tf.cast(record[1], tf.int32)
    take = counts[label] < max_shots
    counts = tf.tensor_scatter_nd_add(counts, [[label]], [tf.cast(take, tf.int32)])
    return counts, (record, take)

  def taken(record, take):
    del record
    return take

  def record_only(record, take):
    del take
    return record

  pool = records.scan(tf.zeros([num_classes], tf.int32), pipeline.as_written(keep))
  pool = pool.filter(pipeline.as_written(taken)).map(pipeline.as_written(record_only))
  return pool.take(max_shots * num_classes).cache()


def _check_shots(shots, labels: np.ndarray, class_name: Callable[[int], str], dataset: str,
                 split: str, setting: Callable[[str], str]) -> None:
  """An n-shot result needs n images of every class: a larger n is refused (never reported
  under a count it did not have)."""
  counts = np.bincount(labels)
  present = np.flatnonzero(counts)
  smallest = present[np.argmin(counts[present])]
  if max(shots) > counts[smallest]:
    name = class_name(int(smallest))
    raise UserError(f"{max(shots)}-shot needs {max(shots)} images of every class, but class "
                    f"{name!r} of '{dataset}' split '{split}' has {counts[smallest]}: use shots of "
                    f'at most {counts[smallest]} ({setting("shots")})')


class FewShotEvaluator:
  """Few-shot accuracies of a model on one dataset: `evaluator(params) -> {'5shot': acc, ...}`."""

  def __init__(self, *, model, mesh, param_shardings, dataset: str, data_dir: Optional[str],
               train_split: str, eval_split: str, shots: Sequence[int], l2_reg: float,
               batch_size: int, spec: specs.Spec, cache: bool = True, info=None,
               setting: Callable[[str], str] = errors.setting):
    """`spec`: the parsed eval preprocessing (`specs.eval_spec`). `info`: the dataset's
    `data.DatasetInfo` when the caller holds it (a run evaluating on its own dataset); else
    `dataset` is looked up in `data_dir`. `setting(option)`: how the running command sets an
    option (`--shots` of the fewshot command, an evaluator entry's key), for the hints."""
    shots = tuple(int(n) for n in shots)
    if not shots or min(shots) < 1:
      raise UserError(f'fewshot.shots={shots} must be positive numbers of examples per class, '
                      f'e.g. (1, 5, 10, 25)')
    if l2_reg < 0:
      raise UserError(f'fewshot.l2_reg={l2_reg} is negative: use a value >= 0, e.g. 1.0')
    self.shots, self.l2_reg, self.mesh = shots, float(l2_reg), mesh
    streams.check_spec(spec, train=False)
    pcount, pindex = jax.process_count(), jax.process_index()
    local_batch = batch_size // pcount
    info = info or data_lib.get_info(dataset, data_dir)
    self.num_classes = info.num_classes
    records, read = pipeline.split_records(info, train_split, cache=False)
    pool = _pool_records(records, max(shots), self.num_classes)
    labels = np.array([int(label) for _, label in pool.as_numpy_iterator()], np.int64)
    if not len(labels):
      raise UserError(f"few-shot split '{train_split}' of '{info.name}' is empty: set "
                      f'{setting("train_split")}')
    _check_shots(shots, labels, lambda c: info.class_names[c], info.name, train_split, setting)
    # Contiguous shares, so the gathered features keep the pool's order on any process count.
    counts = [len(share) for share in np.array_split(np.arange(len(labels)), pcount)]
    start = sum(counts[:pindex])
    self._train = pipeline.padded_eval_batches(
        pool.skip(start).take(counts[pindex]), count=counts[pindex],
        num_batches=-(-max(counts) // local_batch), batch_size=local_batch, spec=spec,
        stored_shape=info.image_shape, read=read)
    self._eval, _ = data_lib.eval_iterator(
        info=info, split=eval_split, batch_size=local_batch, spec=spec, process_index=pindex,
        process_count=pcount, cache=cache)
    self._extract = features_lib.Extractor(model, mesh, param_shardings)

  def features(self, params):
    """((train features, labels), (eval features, labels)) as host numpy arrays."""
    return self._extract(params, self._train), self._extract(params, self._eval)

  def __call__(self, params) -> Dict[str, float]:
    (train_x, train_y), (test_x, test_y) = self.features(params)
    accuracies = fewshot_accuracies(train_x, train_y, test_x, test_y, shots=self.shots,
                                    num_classes=self.num_classes, l2_reg=self.l2_reg)
    return {f'{n}shot': acc for n, acc in accuracies.items()}


def evaluate_checkpoint(checkpoint_dir: str, *, dataset: Optional[str], data_dir: Optional[str],
                        train_split: str, eval_split: str, shots: Sequence[int], l2_reg: float,
                        batch_size: int):
  """Few-shot accuracies of a training checkpoint over all local devices.

  The model and its eval preprocessing come from the config stored with the checkpoint, the params
  are its Polyak average when the run kept one (the params its own evaluations scored); `dataset`
  and `data_dir` default to the run's. Returns (dataset, num_classes, {'1shot': acc, ...}).
  """
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  model, params, config = inputs.load_model(checkpoint_dir, averaged=True)
  mesh = parallel.make_mesh(ml_collections.ConfigDict({'data': -1}))
  if batch_size < 1 or batch_size % mesh.devices.size:
    raise UserError(f'--batch_size={batch_size} does not split over {mesh.devices.size} '
                    f'devices: use a multiple of {mesh.devices.size}')
  dataset = dataset or config.dataset
  evaluator = FewShotEvaluator(
      model=model, mesh=mesh, param_shardings=sharding.replicated(mesh), dataset=dataset,
      data_dir=data_dir or config.data_dir, train_split=train_split, eval_split=eval_split,
      shots=shots, l2_reg=l2_reg, batch_size=batch_size, cache=False,
      spec=specs.eval_spec(config.pp.eval, config.image_size))
  return dataset, evaluator.num_classes, evaluator(params)


__all__ = ['FewShotEvaluator', 'evaluate_checkpoint', 'fewshot_accuracies',
           'first_per_class', 'fit_ridge', 'predict']
