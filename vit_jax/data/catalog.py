"""The embedded datasets by name, and what the trainer needs to know of one, read without
TensorFlow (tfds alone: 0.23 s on AMD EPYC 26/2), so a run on them starts compiling before
TensorFlow is imported."""

import dataclasses
from typing import Optional

from vit_jax.data import digits
from vit_jax.data import mnist5k
from vit_jax.data import split_expr

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
    n = split_expr.num_examples(split, module.SPLIT_SIZES)
  except (ValueError, KeyError, AssertionError):
    return None
  return SplitFacts(module.NUM_CLASSES, module.IMAGE_SHAPE, n) if n else None


__all__ = ['EMBEDDED', 'FOLDER_PREFIX', 'SplitFacts', 'embedded_facts']
