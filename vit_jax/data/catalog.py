"""The embedded datasets by name, their arrays (`source`, read once per process), and the examples
a split expression reads (`in_read_order`), all without TensorFlow.

Split expressions ('train[:90%]', 'train[1000:]+test'; `parts`, `num_examples`, `read_order`):
tfds stores a split's examples in ascending order of the md5 hash of the split's name followed by
the example's key (`tensorflow_datasets.core.hashing`; fixed within a major version of a
dataset's format, so that a slice names the same examples everywhere), and a slice of a split is a
range of that stored order. The embedded datasets are read in the order tfds would store a copy
of them keyed by source row (the copies earlier versions prepared were), so a slice names the
same examples and a stream reads them in the same order; tfds's own parser gives the ranges,
rounding included.
"""

import functools
import hashlib
from typing import Dict, List, Tuple

import numpy as np

from vit_jax.data import digits
from vit_jax.data import embedded
from vit_jax.data import mnist5k

# Read in place from installed packages (vit_jax/data/embedded.py).
EMBEDDED = {module.NAME: module for module in (mnist5k, digits)}
# 'folder:PATH' names a folder of class sub-folders of images (vit_jax/data/folder.py).
FOLDER_PREFIX = 'folder:'


# ---------------------------------------------------------------------------------------------
# Split expressions.


def parts(expression: str, sizes: Dict[str, int]) -> List[Tuple[str, int, int]]:
  """[(split, start, stop)] that `expression` reads of the splits of `sizes` ({split: examples});
  ValueError (tfds's) for an expression tfds cannot read: unknown split, bad syntax, slice out of
  range."""
  if sizes.get(expression, 0) > 0:  # a whole split: what tfds's parser gives, without tfds
    return [(expression, 0, sizes[expression])]
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  infos = {name: tfds.core.SplitInfo(name=name, shard_lengths=[n], num_bytes=0)
           for name, n in sizes.items()}
  out = []
  for part in tfds.core.ReadInstruction.from_spec(expression).to_absolute(infos):
    start, stop, _ = slice(part.from_, part.to).indices(sizes[part.splitname])
    out.append((part.splitname, start, stop))
  return out


def num_examples(expression: str, sizes: Dict[str, int]) -> int:
  return sum(stop - start for _, start, stop in parts(expression, sizes))


def stored_order(split: str, rows: np.ndarray) -> np.ndarray:
  """`rows` (the keys of split `split`) in the order tfds stores them."""
  salted = hashlib.md5(split.encode())

  def key(row) -> int:
    digest = salted.copy()
    digest.update(str(int(row)).encode())
    return int(digest.hexdigest(), 16)

  return np.asarray(sorted(rows, key=key), dtype=np.asarray(rows).dtype)


def read_order(expression: str, splits: Dict[str, np.ndarray]) -> np.ndarray:
  """The source rows `expression` reads of `splits` ({split: rows}), in the order tfds reads them
  (its parts in turn, each in its split's stored order)."""
  sizes = {name: len(r) for name, r in splits.items()}
  return np.concatenate([stored_order(split, splits[split])[start:stop]
                         for split, start, stop in parts(expression, sizes)])


@functools.lru_cache(maxsize=None)
def source(name: str) -> Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]:
  """(images, labels, {split: rows}) of an embedded dataset, its splits checked; read once per
  process (read-only), not once per split (a run reads a train and an eval split)."""
  module = EMBEDDED[name]
  images, labels = module.load_arrays()
  splits = embedded.checked_splits(name, module.split_indices(labels), module.SPLIT_SIZES)
  for array in (images, labels):
    array.flags.writeable = False
  return images, labels, splits


def in_read_order(name: str, expression) -> Tuple[np.ndarray, np.ndarray]:
  """(images uint8 [n, H, W, C], labels int32 [n]) of a split expression (a name, 'train[:90%]',
  a tfds even split) of an embedded dataset, in the order tfds reads it."""
  images, labels, splits = source(name)
  order = read_order(expression, splits)
  return images[order], labels[order].astype(np.int32)


__all__ = ['EMBEDDED', 'FOLDER_PREFIX', 'in_read_order', 'num_examples', 'parts', 'read_order',
           'source', 'stored_order']
