"""The embedded datasets by name, what the trainer needs to know of one, and the examples a
split expression reads, all without TensorFlow or tfds, so a run on them starts compiling before
TensorFlow is imported.

Split expressions ('train[:90%]', 'train[1000:]+test'; `parts`, `num_examples`, `rows`): tfds
stores a split's examples in ascending order of the md5 hash of the split's name followed by the
example's key (`tensorflow_datasets.core.hashing`; fixed within a major version of a
dataset's format, so that a slice names the same examples everywhere), and a slice of a split is a
range of that stored order. The embedded datasets' keys are their source rows (embedded.py), so
`rows` picks the rows tfds would read; tfds's own parser gives the ranges, rounding included.
"""

import dataclasses
import hashlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from vit_jax.data import digits
from vit_jax.data import mnist5k

# Built offline from installed packages on first use (vit_jax/data/embedded.py).
EMBEDDED = {module.NAME: module for module in (mnist5k, digits)}
# 'folder:PATH' names a folder of class sub-folders of images (vit_jax/data/folder.py).
FOLDER_PREFIX = 'folder:'


@dataclasses.dataclass(frozen=True)
class SplitFacts:
  """A dataset's class count and stored image shape, and the size of one of its splits."""
  num_classes: int
  image_shape: tuple
  num_examples: int


def embedded_facts(dataset: str, split: str) -> Optional[SplitFacts]:
  """The facts of split `split` (a name or an expression: 'train[:90%]', 'train+test') of an
  embedded dataset named plainly ('mnist5k', 'digits'); None for any other dataset, and for an
  expression that reads nothing or that tfds cannot read, which `info.get_info` answers (and
  words the error of). The sizes are the ones the builders check when they build the dataset."""
  module = EMBEDDED.get(dataset)
  if module is None:
    return None
  try:
    n = num_examples(split, module.SPLIT_SIZES)
  except (ValueError, KeyError, AssertionError):
    return None
  return SplitFacts(module.NUM_CLASSES, module.IMAGE_SHAPE, n) if n else None


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


def rows(expression: str, splits: Dict[str, np.ndarray]) -> np.ndarray:
  """The source rows `expression` reads of `splits`, ascending (a row read twice, as by
  'train+train', is there twice)."""
  return np.sort(read_order(expression, splits))


__all__ = ['EMBEDDED', 'FOLDER_PREFIX', 'SplitFacts', 'embedded_facts', 'num_examples', 'parts',
           'read_order', 'rows', 'stored_order']
