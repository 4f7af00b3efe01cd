"""Data sources chosen by the dataset name, one module each.

A source module gives `load(dataset, data_dir)`, a `Source` (or None for a name it does not
serve): what `info.get_info` returns for the name (its classes, split sizes, examples per
split), the records the input pipeline streams (`Source.records`) and the identity each
checkpoint records (`Source.identity`). A name is served by the first of: the source of its
registered prefix (`PREFIXES`), the source of its exact name (`NAMES`), tfds (`DEFAULT`) that
gives a `Source`. Adding a source is one module with its `load`, registered here, or a `load`
function that a config file registers (`register`) when it is loaded.
"""

import importlib
from typing import Callable, Dict, Optional, Protocol, Tuple, Union

# prefix -> the module (dotted path) whose `load` serves it, or that `load` function
PREFIXES: Dict[str, Union[str, Callable]] = {
    'vtab/': 'vit_jax.data.sources.vtab',
    'imagenet_': 'vit_jax.data.sources.robustness',  # imagenet_r, imagenet_v2/..., not imagenet2012
    'objectnet': 'vit_jax.data.sources.robustness',
    'folder:': 'vit_jax.data.sources.folder',
}
# exact name -> the module whose `load` serves it
NAMES: Dict[str, str] = {
    'mnist5k': 'vit_jax.data.sources.embedded',
    'digits': 'vit_jax.data.sources.embedded',
    'imagenet21k': 'vit_jax.data.sources.imagenet',
    'imagenet2012': 'vit_jax.data.sources.imagenet',  # tfds's when prepared for tfds
}
DEFAULT = 'vit_jax.data.sources.tfds'  # every other name: a prepared tfds dataset


class Source(Protocol):
  """A dataset as its source serves it (the built-in sources, or one a config file registers)."""
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
    source read in place through the release reader (`in_place.InPlace`) gives (record key,
    label) and its `release` (a `releases.Release`), whose images the pipeline reads by key."""

  # Optional: `identity() -> dict or None`, what a checkpoint records of the data
  # (vit_jax/data/identity.py); without it, the class names, split sizes and the names and sizes
  # of the files in `data_dir` (`identity.of_files`).


def register(prefix: str, load_fn: Union[str, Callable]) -> None:
  """Serves dataset names starting with `prefix` by `load_fn(dataset, data_dir) -> Source` (or a
  module's, given by its dotted path); a prefix registered twice is a ValueError."""
  if prefix in PREFIXES and PREFIXES[prefix] != load_fn:
    raise ValueError(f'data source prefix {prefix!r} is registered already')
  PREFIXES[prefix] = load_fn


def unregister(prefix: str) -> None:
  PREFIXES.pop(prefix, None)


def find(dataset: str) -> Optional[Union[str, Callable]]:
  """What a registered prefix serves `dataset` by (a dotted module path or a load function), or
  None."""
  for prefix, served_by in PREFIXES.items():
    if dataset.startswith(prefix):
      return served_by
  return None


def load(dataset: str, data_dir: Optional[str]) -> Source:
  """The `Source` of `dataset`: its prefix's, else its name's, else tfds's, the first that serves
  it; UserError (tfds's) for a name no source serves."""
  for served_by in (find(dataset), NAMES.get(dataset), DEFAULT):
    if served_by is None:
      continue
    if isinstance(served_by, str):
      served_by = importlib.import_module(served_by).load
    source = served_by(dataset, data_dir)
    if source is not None:
      return source
  raise AssertionError(f'the tfds source returned no source for {dataset!r}')


__all__ = ['DEFAULT', 'NAMES', 'PREFIXES', 'Source', 'find', 'load', 'register', 'unregister']
