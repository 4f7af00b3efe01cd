"""Data sources chosen by the prefix of the dataset name, one module each.

A source module states its `PREFIX` ('vtab/', 'robustness/') and gives `load(dataset,
data_dir)`, a `Source`: what `info.get_info` returns for that name (its classes, split sizes,
examples per split) and the records the input pipeline streams (`Source.records`). Adding a
source is one module registered here (`PREFIXES`) or, from a config file, with `register`.
Names without a registered prefix are served by the built-in kinds: the embedded datasets,
'folder:PATH', the ImageNet releases and tfds (vit_jax/data/info.py).
"""

import importlib
from typing import Dict, Optional, Protocol, Tuple

# prefix -> the module (dotted path) that serves it
PREFIXES: Dict[str, str] = {
    'vtab/': 'vit_jax.data.sources.vtab',
}


class Source(Protocol):
  """A dataset served by a registered source."""
  name: str
  num_classes: int
  image_shape: Tuple[Optional[int], ...]   # (H, W, C) as stored; H, W None if they vary
  split_sizes: Dict[str, int]              # the named splits
  data_dir: str                            # the prepared files the dataset identity hashes
  class_names: Tuple[str, ...]

  def num_examples(self, split) -> int:
    """Examples of a split expression ('train', 'test[:50%]', a tfds even split)."""

  def records(self, split, cache: bool):
    """tf.data of (stored image: encoded bytes or uint8 pixels, int32 label), in read order."""


def register(prefix: str, module: str) -> None:
  """Serves dataset names starting with `prefix` by `module` (a dotted path with `load`)."""
  PREFIXES[prefix] = module


def find(dataset: str) -> Optional[str]:
  """The module serving `dataset`, or None (a built-in kind)."""
  for prefix, module in PREFIXES.items():
    if dataset.startswith(prefix):
      return module
  return None


def load(dataset: str, data_dir: Optional[str]) -> Optional[Source]:
  """The `Source` of `dataset` from its registered module, or None if no prefix matches."""
  module = find(dataset)
  return None if module is None else importlib.import_module(module).load(dataset, data_dir)


__all__ = ['PREFIXES', 'Source', 'find', 'load', 'register']
