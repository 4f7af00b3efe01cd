"""Finding a dataset: `get_info(dataset, data_dir)`, resolved once per run and passed on.

The name chooses its source (`vit_jax.data.sources`: the embedded datasets, 'folder:PATH', the
ImageNet releases, VTAB-1k, the robustness sets, a config file's own, else tfds), and the
`DatasetInfo` holds that source. A tfds dataset must already be prepared in `data_dir` (a local
or gs:// path): `load_builder` finds its builder and never downloads.
"""

import dataclasses
import difflib
import os
from typing import Any, Optional, Type

import tensorflow_datasets as tfds

from vit_jax import fileio
from vit_jax.data import catalog
from vit_jax.data import embedded
from vit_jax.data import offline_info
from vit_jax.data import releases
from vit_jax.data import sources
from vit_jax.errors import UserError

# Dataset names listed as examples in the "unknown dataset" message.
_EXAMPLE_NAMES = ('mnist5k', 'digits', 'cifar10', 'cifar100', 'imagenet2012', 'oxford_iiit_pet')


def split_count(name: str, split, sizes, example: str) -> int:
  """Examples in `split` (maybe sliced) of a dataset whose split sizes are `sizes`; UserError
  naming the splits and a slicing `example` for a bad one."""
  try:
    return catalog.num_examples(split, sizes)
  except (KeyError, ValueError, AssertionError) as e:
    raise UserError(f"bad split {str(split)!r} for dataset '{name}' ({_one_line(e)}); "
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
  def release(self) -> Optional[releases.Release]:
    """The release a source read in place reads its images from by key (`in_place`), else
    None."""
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


def load_builder(dataset: str, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
  """Returns the tfds builder of a prepared dataset; never downloads.

  Raises `UserError` if the name is unknown to tfds or the dataset is not prepared in `data_dir`.
  A folder ('folder:PATH') has no tfds builder: it is read in place (sources/folder.py).
  """
  if dataset.startswith(catalog.FOLDER_PREFIX):
    raise ValueError(f'{dataset} is read in place (sources/folder.py), not through tfds')
  try:
    name, name_kwargs = tfds.core.naming.parse_builder_name_kwargs(dataset)
  except (ValueError, TypeError) as e:
    raise UserError(f"invalid dataset name {dataset!r}: {_one_line(e)}; give a tfds name such as "
                    f"'cifar10' or 'cifar10:3.0.2'") from None
  if name.namespace:
    # Community namespaces (huggingface:, kaggle:, ...) resolve over the network.
    raise UserError(f"dataset {dataset!r} has a community namespace '{name.namespace}:', which "
                    f"needs the network; prepare it locally with `tfds build` and pass its plain "
                    f"name and --data_dir")
  if name.name in catalog.EMBEDDED:  # read from its arrays (sources/embedded.py), never tfds
    raise UserError(f"dataset {dataset!r}: {name.name} has no configs, only version "
                    f"{embedded.VERSION} and no tfds copy; use dataset='{name.name}'")
  cls = _registered_class(name.name)
  looked_in = _absent_locally(cls.name if cls else name.name, data_dir)
  if looked_in:  # said without building the tfds builder, which imports TensorFlow
    if cls is None:
      raise UserError(_unknown_dataset_message(dataset))
    raise UserError(_not_prepared_message(dataset, cls, ' or '.join(looked_in),
                                          data_dir or _default_data_dir(), data_dir))
  try:
    with offline_info.no_leftover_temp_dirs():  # a directory without dataset_info.json
      builder = tfds.builder(dataset, data_dir=data_dir, try_gcs=False)
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(_unknown_dataset_message(dataset)) from None
  except (ValueError, AssertionError) as e:  # unknown config or version: 'cifar10/x', 'cifar10:9.9'
    raise UserError(f'cannot open dataset {dataset!r}: {_one_line(e)}; check the config/version '
                    f'part of the name against the tfds catalog') from None
  if not builder.is_prepared():
    root = builder.data_dir_root if hasattr(builder, 'data_dir_root') else data_dir
    raise UserError(_not_prepared_message(dataset, builder, builder.data_dir, root, data_dir))
  return builder


def _registered_class(name: str) -> Optional[Type[tfds.core.DatasetBuilder]]:
  """The tfds builder class registered as `name` (imported, not built), or None."""
  try:
    return tfds.core.registered.imported_builder_cls(name)
  except tfds.core.registered.DatasetNotFoundError:
    return None


def _default_data_dir() -> str:
  return os.path.expanduser(tfds.core.constants.DATA_DIR)


def _absent_locally(name: str, data_dir: Optional[str]) -> list:
  """The `<data_dir>/<name>` directories tfds would read `name` from, when they are all local
  and none exists (so the dataset is surely not prepared); [] when one exists or may (remote).
  tfds also reads datasets prepared without their code from such a directory."""
  dirs = [str(d) for d in tfds.core.utils.file_utils.list_data_dirs(data_dir)]
  if any(fileio.is_remote(d) for d in dirs):
    return []
  candidates = [os.path.join(os.path.expanduser(d), name) for d in dirs]
  return [] if any(os.path.exists(c) for c in candidates) else candidates


def _unknown_dataset_message(dataset: str) -> str:
  names = tfds.list_builders(with_community_datasets=False)
  close = difflib.get_close_matches(dataset, names + list(catalog.EMBEDDED) +
                                    list(releases.NAMES), n=3)
  hint = f' (did you mean {", ".join(close)}?)' if close else ''
  examples = ', '.join(_EXAMPLE_NAMES)
  return (f"unknown dataset {dataset!r}{hint}: use one of the names registered with "
          f"tensorflow-datasets, e.g. {examples}, ... (see `tfds.list_builders()`)")


def _not_prepared_message(dataset: str, builder, where: str, root: str,
                          data_dir: Optional[str]) -> str:
  """`builder` is the tfds builder or its class; `where` the directory tfds looked in."""
  where = f'{where} (data_dir={root})'
  if data_dir is None:
    where += ', the default because --data_dir was not given'
  fix = f'prepare it once with `tfds build {dataset} --data_dir={root}`'
  if getattr(builder, 'MANUAL_DOWNLOAD_INSTRUCTIONS', None):
    fix += (f' after placing its manually downloaded files in {root}/downloads/manual '
            f'(see the tfds catalog page of {builder.name} for which files)')
  if dataset == 'imagenet2012':
    fix += (f', or put {releases.I1K_TRAIN}, {releases.I1K_VAL} and the devkit in '
            f'{root}/imagenet2012 to read them in place (docs/data.md)')
  if dataset == 'imagenet2012_real':
    fix += (f', or put ReaL\'s {releases.REAL_LABELS} beside the ILSVRC2012 archives in '
            f'{root}/imagenet2012 (docs/data.md)')
  fix += ', or point --data_dir at a directory where it is prepared'
  return f'dataset {dataset!r} is not prepared: tfds looked in {where}; {fix}'


def _one_line(error: Exception) -> str:
  return ' '.join(str(error).split())
