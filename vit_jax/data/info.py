"""Finding a dataset: `get_info(dataset, data_dir)`, resolved once per run and passed on.

The name chooses its source (`vit_jax.data.sources`: the embedded datasets, 'folder:PATH', the
ImageNet releases, VTAB-1k, the robustness sets, a config file's own, else tfds), and the
`DatasetInfo` holds that source. A tfds dataset must already be prepared in `data_dir` (a local
or gs:// path): `sources.tfds.load_builder` finds its builder and never downloads.
"""

import dataclasses
from typing import Any, Optional

from vit_jax.data import catalog
from vit_jax.data import sources
from vit_jax.errors import UserError


def split_count(name: str, split, sizes, example: str) -> int:
  """Examples in `split` (maybe sliced) of a dataset whose split sizes are `sizes`; UserError
  naming the splits and a slicing `example` for a bad one."""
  try:
    return catalog.num_examples(split, sizes)
  except (KeyError, ValueError, AssertionError) as e:
    raise UserError(f"bad split {str(split)!r} for dataset '{name}' ({one_line(e)}); "
                    f"use one of {', '.join(sizes)}, optionally sliced like {example}") from None


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the trainer needs to know about a dataset: its source's facts, and the source
  (`vit_jax.data.sources`), which answers for its splits, classes, records and identity."""

  name: str
  data_dir: str  # the versioned directory the records are read from ('' for none)
  num_classes: int
  image_shape: tuple[Optional[int], ...]  # (H, W, C) as stored; H, W are None if they vary
  split_sizes: dict[str, int]  # the named splits only, e.g. {'train': 50000, 'test': 10000}
  source: Any = dataclasses.field(repr=False, compare=False)

  @property
  def release(self):
    """The `releases.Release` a source read in place reads its images from by key
    (`sources.in_place`), else None."""
    return getattr(self.source, 'release', None)

  @property
  def skipped(self) -> dict:
    """What reading a folder in place skipped ({kind: names}; folder.py), else {}."""
    return dict(getattr(self.source, 'skipped', {}))

  def num_examples(self, split) -> int:
    """Number of examples in a tfds split string ('train', 'train[:90%]', 'train+test', ...)."""
    return self.source.num_examples(split)

  @property
  def class_names(self) -> tuple[str, ...]:
    return tuple(self.source.class_names)


def get_info(dataset: str, data_dir: Optional[str]) -> DatasetInfo:
  """Returns the `DatasetInfo` of the source serving `dataset` (`vit_jax.data.sources`: by
  prefix, by name, else a prepared tfds dataset); raises `UserError` if it is unknown/absent."""
  source = sources.load(dataset, data_dir)
  return DatasetInfo(name=source.name, data_dir=source.data_dir, num_classes=source.num_classes,
                     image_shape=tuple(source.image_shape),
                     split_sizes=dict(source.split_sizes), source=source)


def one_line(error: Exception) -> str:
  """An error's message on one line (for a UserError that quotes it)."""
  return ' '.join(str(error).split())
