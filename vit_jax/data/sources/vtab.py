"""VTAB-1k: the 19 tasks of the Visual Task Adaptation Benchmark, named 'vtab/<task>', read
from their prepared tfds datasets on the benchmark's own splits and labels.

The reference is google-research/task_adaptation (its `task_adaptation/data/*.py`): each task
cuts its tfds dataset into train / val / test, and VTAB-1k trains on the first 800 images of
train ('train800') and the first 200 of val ('val200'), together 'train800val200', and tests
on the whole test split. A task's split is a tfds split expression over its dataset, worked
out from the tfds split sizes by the benchmark's rule (`Task.splits`):
  - 'percent': train is the first `train_percent`% of the tfds train split (rounded down), val
    follows it (to the end, or the next `val_percent`%), test is `test` or the rest of train;
  - 'named': train and val are the tfds splits `train` and `val`, test is `test`.
Seven tasks derive their label from other features of the records (`LABELS`), as the
benchmark's preprocessing does; dSprites images (0/1 pixels) are scaled to 0/255.

  splits(task, tfds_sizes)  -> {'train800', 'val200', 'train800val200', 'test': expression}
  TASKS, GROUPS             the tasks and the paper's natural / specialized / structured groups
  label_fn(task)            tfds example -> int label (the tfds label or the derived one)
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

PREFIX = 'vtab/'
SPLITS = ('train800', 'val200', 'train800val200', 'test')
TRAIN_IMAGES, VAL_IMAGES = 800, 200


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB task: its tfds dataset, how the benchmark splits it, and its label."""
  tfds_name: str
  rule: str                     # 'percent' or 'named' (module docstring)
  train_percent: int = 0        # 'percent': train's share of the tfds train split
  val_percent: int = 0          # 'percent': val's share (0: val is the rest of the train split)
  val: str = 'validation'       # 'named': the tfds split val's 200 images come from
  test: str = 'test'            # the test split ('' with 'percent': the rest of train)
  label: str = 'label'          # the tfds label feature, or a key of LABELS (derived)
  num_classes: Optional[int] = None  # of a derived label (else the tfds feature's)

  def splits(self, tfds_sizes: Dict[str, int]) -> Dict[str, str]:
    """The task's VTAB-1k splits as tfds expressions, given its tfds split sizes."""
    if self.rule == 'named':
      train, val = 'train[:800]', f'{self.val}[:200]'
      test = self.test
    else:
      total = tfds_sizes['train']
      train_count = self.train_percent * total // 100
      train, val = 'train[:800]', f'train[{train_count}:{train_count + VAL_IMAGES}]'
      if self.test:
        test = self.test
      else:
        test = f'train[{train_count + self.val_percent * total // 100}:]'
    return {'train800': train, 'val200': val, 'train800val200': f'{train}+{val}', 'test': test}


def _percent(tfds_name, train, val=0, test='test', **kw) -> Task:
  return Task(tfds_name, 'percent', train_percent=train, val_percent=val, test=test, **kw)


def _named(tfds_name, val='validation', test='test', **kw) -> Task:
  return Task(tfds_name, 'named', val=val, test=test, **kw)


# task_adaptation/data/<dataset>.py: the split percentages and label derivations.
TASKS: Dict[str, Task] = {
    'caltech101': _percent('caltech101', 90),
    'cifar100': _percent('cifar100', 90),
    'dtd': _named('dtd'),
    'oxford_flowers102': _named('oxford_flowers102'),
    'oxford_iiit_pet': _percent('oxford_iiit_pet', 80),
    'sun397': _named('sun397/tfds'),
    'svhn': _percent('svhn_cropped', 90),
    'patch_camelyon': _named('patch_camelyon'),
    'eurosat': _percent('eurosat/rgb', 60, 20, test=''),
    'resisc45': _percent('resisc45', 60, 20, test=''),
    'diabetic_retinopathy': _named('diabetic_retinopathy_detection/btgraham-300'),
    'clevr_count': _percent('clevr', 90, test='validation', label='clevr_count', num_classes=8),
    'clevr_distance': _percent('clevr', 90, test='validation', label='clevr_distance',
                               num_classes=6),
    'dmlab': _named('dmlab'),
    'kitti_distance': _named('kitti', label='kitti_distance', num_classes=4),
    'dsprites_location': _percent('dsprites', 80, 10, test='', label='dsprites_location',
                                  num_classes=16),
    'dsprites_orientation': _percent('dsprites', 80, 10, test='', label='dsprites_orientation',
                                     num_classes=16),
    'smallnorb_azimuth': _named('smallnorb', val='test', test='test[50%:]',
                                label='label_azimuth'),
    'smallnorb_elevation': _named('smallnorb', val='test', test='test[50%:]',
                                  label='label_elevation'),
}

# The paper's three groups (VTAB paper, Section 3; ViT paper, Figure 2 and Table 9).
GROUPS: Dict[str, Tuple[str, ...]] = {
    'natural': ('caltech101', 'cifar100', 'dtd', 'oxford_flowers102', 'oxford_iiit_pet',
                'sun397', 'svhn'),
    'specialized': ('patch_camelyon', 'eurosat', 'resisc45', 'diabetic_retinopathy'),
    'structured': ('clevr_count', 'clevr_distance', 'dmlab', 'kitti_distance',
                   'dsprites_location', 'dsprites_orientation', 'smallnorb_azimuth',
                   'smallnorb_elevation'),
}


# ---------------------------------------------------------------------------------------------
# Derived labels (task_adaptation/data/clevr.py, kitti.py, dsprites.py), on one tfds example.


def _threshold_bin(value, thresholds):
  """The index of the last threshold below `value` (the benchmark's binning of a distance)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  below = tf.where(tf.constant(thresholds, tf.float32) - tf.cast(value, tf.float32) < 0)
  return tf.cast(tf.reduce_max(below), tf.int32)


def _clevr_count(ex):
  """The number of objects, 3-10, as classes 0-7."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.size(ex['objects']['size']) - 3


def _clevr_distance(ex):
  """The depth of the closest object (pixel_coords' third value), in 6 bins."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  depth = tf.reduce_min(ex['objects']['pixel_coords'][:, 2])
  return _threshold_bin(depth, [0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])


def _kitti_distance(ex):
  """The depth of the closest vehicle (car, van, truck: types 0-2) in 3 bins, 3: no vehicle."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  vehicles = ex['objects']['type'] < 3
  depths = tf.boolean_mask(tf.cast(ex['objects']['location'][:, 2], tf.float32), vehicles)
  depth = tf.reduce_min(tf.concat([depths, [1000.0]], 0))
  return _threshold_bin(depth, [-100.0, 8.0, 20.0, 999.0])


def _binned(feature: str, original_classes: int, classes: int):
  """A feature's value grouped into `classes` equal bins of its `original_classes` values."""
  def label(ex):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    factor = original_classes / classes
    return tf.cast(tf.math.floordiv(tf.cast(ex[feature], tf.float32), factor), tf.int32)
  return label


LABELS: Dict[str, Callable] = {
    'clevr_count': _clevr_count,
    'clevr_distance': _clevr_distance,
    'kitti_distance': _kitti_distance,
    'dsprites_location': _binned('label_x_position', 32, 16),
    'dsprites_orientation': _binned('label_orientation', 40, 16),
}


def label_fn(task: Task) -> Callable:
  """tfds example -> its int32 label for `task`."""
  if task.label in LABELS:
    return LABELS[task.label]

  def feature(ex):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.cast(ex[task.label], tf.int32)
  return feature


def image_fn(task: Task) -> Optional[Callable]:
  """stored image -> the image the task trains on, or None (as stored). dSprites' PNGs hold
  0/1 pixels: decoded and scaled to 0/255, as the benchmark does."""
  if task.tfds_name != 'dsprites':
    return None

  def scaled(encoded):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.decode_png(encoded, channels=1) * 255
  return scaled


# ---------------------------------------------------------------------------------------------
# The source: 'vtab/<task>' read from the task's prepared tfds dataset.


def pieces(expression: str, sizes: Dict[str, int]) -> List[Tuple[str, int, int]]:
  """[(tfds split, start, stop)] a tfds expression reads, with tfds's own rounding."""
  from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
  return catalog.parts(expression, sizes)


class VtabSource:
  """A VTAB task's splits ('train800', 'val200', 'train800val200', 'test') over its tfds
  dataset; any slice of them ('test[:50%]', a tfds even split) reads the matching records."""

  def __init__(self, name: str, task: Task, builder):
    self.name, self.task, self.builder = name, task, builder
    info = builder.info
    tfds_sizes = {s: int(v.num_examples) for s, v in info.splits.items()}
    self.expressions = task.splits(tfds_sizes)
    self._pieces = {s: pieces(e, tfds_sizes) for s, e in self.expressions.items()}
    self.split_sizes = {s: sum(b - a for _, a, b in p) for s, p in self._pieces.items()}
    image = info.features['image']
    self.image_shape = tuple(image.shape)
    feature = info.features[task.label] if task.label in info.features else None
    self.num_classes = task.num_classes or int(feature.num_classes)
    names = getattr(feature, 'names', None) if task.num_classes is None else None
    self.class_names = tuple(names) if names else tuple(str(c) for c in range(self.num_classes))
    self.data_dir = str(builder.data_dir)

  def tfds_split(self, split) -> str:
    """The tfds expression of a split expression over this task's splits."""
    from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
    out = []
    for name, start, stop in catalog.parts(split, self.split_sizes):
      at = 0
      for tfds_split, a, b in self._pieces[name]:
        lo, hi = max(start, at), min(stop, at + b - a)
        if lo < hi:
          out.append(f'{tfds_split}[{a + lo - at}:{a + hi - at}]')
        at += b - a
    return '+'.join(out)

  def num_examples(self, split) -> int:
    from vit_jax.data import info  # pylint: disable=g-import-not-at-top
    return info.split_count(self.name, split, self.split_sizes, "'test[:50%]'")

  def records(self, split, cache: bool):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
    label, image = label_fn(self.task), image_fn(self.task)
    ds = self.builder.as_dataset(
        split=self.tfds_split(split), shuffle_files=False,
        decoders={'image': tfds.decode.SkipDecoding()},
        read_config=tfds.ReadConfig(try_autocache=False, add_tfds_id=False))
    ds = ds.map(pipeline.as_written(
        lambda ex: (image(ex['image']) if image else ex['image'], tf.cast(label(ex), tf.int32))))
    return ds.cache() if cache else ds


def load(dataset: str, data_dir: Optional[str]) -> VtabSource:
  """The source of 'vtab/<task>'; UserError for an unknown task or an unprepared dataset."""
  from vit_jax.data.sources import tfds as tfds_source  # pylint: disable=g-import-not-at-top
  from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
  name = dataset[len(PREFIX):]
  if name not in TASKS:
    raise UserError(f'unknown VTAB task {name!r} in dataset={dataset!r}: use vtab/ and one of '
                    f'{", ".join(TASKS)}')
  return VtabSource(dataset, TASKS[name], tfds_source.load_builder(TASKS[name].tfds_name,
                                                                  data_dir))


# ---------------------------------------------------------------------------------------------
# Results.


def aggregate(top1: Dict[str, float]) -> Dict[str, float]:
  """Per-task top-1 -> the mean over the 19 tasks and each group's mean (the paper's VTAB
  columns); a mean over a group with a task missing is left out (never a mean of a part)."""
  unknown = sorted(set(top1) - set(TASKS))
  if unknown:
    raise ValueError(f'not VTAB tasks: {", ".join(unknown)}')
  out = {}
  for group, tasks in GROUPS.items():
    if all(t in top1 for t in tasks):
      out[group] = float(np.mean([top1[t] for t in tasks]))
  if len(top1) == len(TASKS):
    out['mean'] = float(np.mean(list(top1.values())))
  return out


def table(top1: Dict[str, float]) -> str:
  """A Markdown table of the tasks' top-1 (%) by group, then the group means and the mean."""
  means = aggregate(top1)
  lines = ['| group | task | top-1 (%) |', '|---|---|---|']
  for group, tasks in GROUPS.items():
    lines += [f'| {group} | {t} | {100 * top1[t]:.1f} |' for t in tasks if t in top1]
  lines += [f'| {"all 19" if name == "mean" else name} | mean | {100 * value:.1f} |'
            for name, value in means.items()]
  return '\n'.join(lines) + '\n'


def from_rows(rows) -> Dict[str, float]:
  """{task: top-1} of a VTAB sweep's runs (dicts with 'dataset' = 'vtab/<task>' and
  'accuracy'; experiments/vtab/sweep.py); runs without a result are left out."""
  out = {}
  for row in rows:
    task = str(row.get('dataset', ''))[len(PREFIX):]
    if task in TASKS and row.get('accuracy') not in (None, ''):
      out[task] = float(row['accuracy'])
  return out


def from_sweep(results_csv: str) -> Dict[str, float]:
  """{task: top-1} of a VTAB sweep's results.csv (`from_rows` of its rows)."""
  import csv  # pylint: disable=g-import-not-at-top
  with open(results_csv, newline='') as f:
    return from_rows(csv.DictReader(f))


__all__ = ['GROUPS', 'LABELS', 'PREFIX', 'SPLITS', 'TASKS', 'Task', 'VtabSource', 'aggregate',
           'from_rows', 'from_sweep', 'image_fn', 'label_fn', 'load', 'table']
