"""The tfds builders of the embedded datasets (embedded.py), which import tfds.

`EmbeddedBuilder` turns a dataset's `arrays()` and fixed `splits(labels)` rule into a tfds
dataset with PNG-encoded images; example keys are the row numbers of `arrays()`, so every record
traces back to its source. `builder_class(module)` defines the builder of `mnist5k` or `digits`
from its module's facts (and so registers it with tfds) once per process; `prepare(cls, data_dir)`
builds a dataset once, offline (nothing is downloaded, no statistics are computed).
"""

import contextlib
import io
import threading
import types
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from vit_jax.data import embedded
from vit_jax.data.offline_info import OfflineDatasetInfo


class EmbeddedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the embedded datasets; subclasses set the class attributes and two methods."""

  VERSION = tfds.core.Version(embedded.VERSION)
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
    splits = embedded.checked_splits(self.name, self.splits(labels), self.SPLIT_SIZES)
    return {name: self._generate_examples(images, labels, rows) for name, rows in splits.items()}

  def _generate_examples(self, images, labels, rows):
    for row in rows:
      yield int(row), {'image': images[row], 'label': int(labels[row])}


_CLASSES: Dict[str, type] = {}
_CLASSES_LOCK = threading.Lock()  # tfds refuses a second registration of a name


def builder_class(module: types.ModuleType) -> type:
  """`module.BUILDER_NAME`, the `EmbeddedBuilder` of an embedded dataset's module (its facts,
  `load_arrays` and `split_indices`), defined once per process; its `__module__` is the dataset's
  module, as tfds records in the dataset's info."""
  with _CLASSES_LOCK:
    if module.NAME not in _CLASSES:

      def body(namespace):
        namespace.update(
            __module__=module.__name__, __doc__=module.DESCRIPTION,
            name=module.NAME, RELEASE_NOTES=module.RELEASE_NOTES, IMAGE_SHAPE=module.IMAGE_SHAPE,
            NUM_CLASSES=module.NUM_CLASSES, SPLIT_SIZES=module.SPLIT_SIZES,
            HOMEPAGE=module.HOMEPAGE, DESCRIPTION=module.DESCRIPTION,
            arrays=lambda self: module.load_arrays(),
            splits=lambda self, labels: module.split_indices(labels))

      _CLASSES[module.NAME] = types.new_class(module.BUILDER_NAME, (EmbeddedBuilder,),
                                              exec_body=body)
    return _CLASSES[module.NAME]


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


__all__ = ['EmbeddedBuilder', 'builder_class', 'prepare']
