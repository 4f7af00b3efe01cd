"""Data sources chosen by the prefix of the dataset name, one module each.

A source gives `load(dataset, data_dir)`, a `Source`: what `info.get_info` returns for the name
(its classes, split sizes, examples per split) and the records the input pipeline streams
(`Source.records`). Adding a source is one module with its `load`, registered here by prefix
(`PREFIXES`), or a `load` function that a config file registers (`register`) when it is loaded.
Names without a registered prefix are served by the built-in kinds: the embedded datasets,
'folder:PATH', the ImageNet releases and tfds (vit_jax/data/info.py).
"""

import importlib
from typing import Callable, Dict, Optional, Protocol, Tuple, Union

# prefix -> the module (dotted path) whose `load` serves it, or that `load` function
PREFIXES: Dict[str, Union[str, Callable]] = {
    'vtab/': 'vit_jax.data.sources.vtab',
    'imagenet_': 'vit_jax.data.sources.robustness',  # imagenet_r, imagenet_v2/..., not imagenet2012
    'objectnet': 'vit_jax.data.sources.robustness',
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
    """tf.data of (stored image: encoded bytes or uint8 pixels, int32 label), in read order. A
    source read in place through the release reader gives `release` (a `releases.Release`)
    instead, and the pipeline reads its images by key."""


def register(prefix: str, load_fn: Union[str, Callable]) -> None:
  """Serves dataset names starting with `prefix` by `load_fn(dataset, data_dir) -> Source` (or a
  module's, given by its dotted path); a prefix registered twice is a ValueError."""
  if prefix in PREFIXES and PREFIXES[prefix] != load_fn:
    raise ValueError(f'data source prefix {prefix!r} is registered already')
  PREFIXES[prefix] = load_fn


def unregister(prefix: str) -> None:
  PREFIXES.pop(prefix, None)


def find(dataset: str) -> Optional[Union[str, Callable]]:
  """What serves `dataset` (a dotted module path or a load function), or None (a built-in
  kind)."""
  for prefix, served_by in PREFIXES.items():
    if dataset.startswith(prefix):
      return served_by
  return None


def load(dataset: str, data_dir: Optional[str]) -> Optional[Source]:
  """The `Source` of `dataset` from what its prefix registers, or None if no prefix matches or
  the source does not serve the name (it falls through to the built-in kinds)."""
  served_by = find(dataset)
  if served_by is None:
    return None
  if isinstance(served_by, str):
    served_by = importlib.import_module(served_by).load
  return served_by(dataset, data_dir)


__all__ = ['PREFIXES', 'Source', 'find', 'load', 'register', 'unregister']
