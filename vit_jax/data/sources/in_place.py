"""The base of the sources read in place through the release reader (vit_jax/data/releases.py):
a folder of class folders, the ImageNet releases, the robustness sets.

Their records are (record key, label): the pipeline reads each key's image where it lies
(`release`), and their identity is the content digest of the index (`identity.of_content`).
"""

from typing import Dict, Tuple

from vit_jax.data import identity
from vit_jax.data import releases


class InPlace:
  """A `sources.Source` over a `releases.Release`, named `name` (the release's by default)."""

  image_shape = (None, None, 3)

  def __init__(self, release: releases.Release, name: str = ''):
    self.release = release
    self.name = name or release.name
    self.data_dir = release.root
    self.num_classes = len(release.classes)
    self.class_names = release.classes
    self.split_sizes = release.split_sizes

  @property
  def skipped(self) -> Dict[str, Tuple[str, ...]]:
    """What indexing skipped ({kind: names}; vit_jax/data/folder.py), else {}."""
    return dict(self.release.skipped)

  def num_examples(self, split) -> int:
    return sum(len(rows) for _, rows, _ in self.release.select(split))

  def records(self, split, cache: bool):
    """tf.data of (record key int64, label int32) in read order; `release` reads the images."""
    del cache  # the keys are computed, not read
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    keys, labels = releases.records(self.release, split)
    return tf.data.Dataset.from_tensor_slices((keys, labels))

  def identity(self) -> dict:
    return identity.of_content(self)


__all__ = ['InPlace']
