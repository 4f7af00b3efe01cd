"""Finding a dataset: `get_info(dataset, data_dir)`, resolved once per run and passed on.

Any dataset registered with tensorflow-datasets can be named. Datasets must already be prepared
in `data_dir` (a local or gs:// path): this module never downloads. Read in place instead: the
embedded datasets `mnist5k` and `digits` (`catalog.EMBEDDED`, arrays carried by installed
packages), and through an index (`find_release`): 'folder:PATH', a folder of class sub-folders of
your own images (`vit_jax.data.folder`), and the ImageNet releases (`vit_jax.data.releases`).
"""

import dataclasses
import difflib
import glob
import os
from typing import Any, Optional, Type

import tensorflow_datasets as tfds

from vit_jax import fileio
from vit_jax.data import catalog
from vit_jax.data import embedded
from vit_jax.data import folder
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
  """What the trainer needs to know about a prepared dataset."""

  name: str
  data_dir: str  # the versioned directory the records are read from
  num_classes: int
  image_shape: tuple[Optional[int], ...]  # (H, W, C) as stored; H, W are None if they vary
  image_key: str
  label_key: str
  split_sizes: dict[str, int]  # the named splits only, e.g. {'train': 50000, 'test': 10000}
  # The tfds info of a tfds dataset; None for one read in place (`release`, or its arrays).
  tfds_info: Optional[tfds.core.DatasetInfo] = dataclasses.field(repr=False, compare=False)
  release: Optional[releases.Release] = dataclasses.field(default=None, repr=False,
                                                          compare=False)
  # The tfds builder the records are read through (a tfds dataset), or the module of an embedded
  # dataset read from its arrays (`catalog.EMBEDDED`).
  builder: Optional[tfds.core.DatasetBuilder] = dataclasses.field(default=None, repr=False,
                                                                  compare=False)
  embedded: Any = dataclasses.field(default=None, repr=False, compare=False)
  # The registered source serving the name (`vit_jax.data.sources`), which answers for its splits,
  # classes and records.
  source: Any = dataclasses.field(default=None, repr=False, compare=False)

  @property
  def skipped(self) -> dict:
    """What reading a folder in place skipped ({kind: names}; folder.py), else {}."""
    return dict(self.release.skipped) if self.release is not None else {}

  def num_examples(self, split) -> int:
    """Number of examples in a tfds split string ('train', 'train[:90%]', 'train+test', ...)."""
    if self.source is not None:
      return self.source.num_examples(split)
    if self.release is not None:
      return sum(len(rows) for _, rows, _ in self.release.select(split))
    if self.embedded is not None:
      return split_count(self.name, split, self.split_sizes, "'train[:90%]' or 'train[1000:]'")
    return _num_examples(self.tfds_info, split, self.name)

  @property
  def class_names(self) -> tuple[str, ...]:
    if self.source is not None:
      return tuple(self.source.class_names)
    if self.release is not None:
      return self.release.classes
    if self.embedded is not None:
      return tuple(str(c) for c in range(self.num_classes))
    return tuple(self.tfds_info.features[self.label_key].names)


def get_info(dataset: str, data_dir: Optional[str]) -> DatasetInfo:
  """Returns the `DatasetInfo` of a prepared dataset or a release read in place (releases.py);
  raises `UserError` if it is unknown/absent. A name with a registered prefix is served by its
  source (`vit_jax.data.sources`)."""
  source = sources.load(dataset, data_dir)
  if source is not None:
    return info_from_source(source)
  if dataset in catalog.EMBEDDED:
    return info_from_embedded(catalog.EMBEDDED[dataset])
  release = find_release(dataset, data_dir)
  if release is not None:
    return info_from_release(release)
  return info_from_builder(load_builder(dataset, data_dir))


def info_from_source(source) -> DatasetInfo:
  """The info of a dataset served by a registered source (`sources.Source`)."""
  return DatasetInfo(name=source.name, data_dir=source.data_dir, num_classes=source.num_classes,
                     image_shape=tuple(source.image_shape), image_key='image', label_key='label',
                     split_sizes=dict(source.split_sizes), tfds_info=None, source=source,
                     release=getattr(source, 'release', None))


def info_from_embedded(module) -> DatasetInfo:
  """The info of an embedded dataset (its module's stated facts; the arrays are read in place)."""
  return DatasetInfo(name=module.NAME, data_dir='', num_classes=module.NUM_CLASSES,
                     image_shape=tuple(module.IMAGE_SHAPE), image_key='image', label_key='label',
                     split_sizes=dict(module.SPLIT_SIZES), tfds_info=None, embedded=module)


def find_release(dataset: str, data_dir: Optional[str]) -> Optional[releases.Release]:
  """The source `dataset` is read from in place, or None when it is a tfds dataset: a folder
  ('folder:PATH', listed again at each call so that a change is seen), 'imagenet21k', and
  'imagenet2012' unless it is prepared for tfds (that route first) or no archive of it is found
  (`releases`: each indexed and checked once per process)."""
  if dataset.startswith(catalog.FOLDER_PREFIX):
    return folder.load(dataset, data_dir)
  if dataset not in releases.NAMES:
    return None
  if dataset == 'imagenet2012' and _tfds_prepared(dataset, data_dir):
    return None
  key = (dataset, data_dir)
  if key not in _RELEASES:
    _RELEASES[key] = releases.find(dataset, data_dir)
  return _RELEASES[key]


_RELEASES: dict = {}  # (dataset, data_dir) -> Release: indexed and checked once per process


def real_release(dataset: str, data_dir: Optional[str]) -> Optional[releases.Release]:
  """The ImageNet-1k release whose validation images ImageNet ReaL scores, when `dataset` is
  'imagenet2012_real', tfds has no prepared copy of it, and the release's directory holds
  `real.json`; else None (tfds's `imagenet2012_real` is read)."""
  if dataset != 'imagenet2012_real' or _tfds_prepared(dataset, data_dir):
    return None
  root = releases.i1k_root(data_dir)
  if root is None or not os.path.exists(os.path.join(root, releases.REAL_LABELS)):
    return None
  key = ('imagenet2012', data_dir, 'real')
  if key not in _RELEASES:
    _RELEASES[key] = releases.imagenet2012(data_dir, root)
  return _RELEASES[key]


def _tfds_prepared(dataset: str, data_dir: Optional[str]) -> bool:
  dirs = [os.path.expanduser(str(d)) for d in tfds.core.utils.file_utils.list_data_dirs(data_dir)]
  return any(glob.glob(os.path.join(glob.escape(d), dataset, '*', 'dataset_info.json'))
             for d in dirs)


def info_from_release(release: releases.Release) -> DatasetInfo:
  return DatasetInfo(name=release.name, data_dir=release.root, num_classes=len(release.classes),
                     image_shape=(None, None, 3), image_key='image', label_key='label',
                     split_sizes=release.split_sizes, tfds_info=None, release=release)


def load_builder(dataset: str, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
  """Returns the tfds builder of a prepared dataset; never downloads.

  Raises `UserError` if the name is unknown to tfds or the dataset is not prepared in `data_dir`.
  A folder ('folder:PATH') has no tfds builder: it is read in place (`find_release`).
  """
  if dataset.startswith(catalog.FOLDER_PREFIX):
    raise ValueError(f'{dataset} is read in place (find_release), not through tfds')
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
  if name.name in catalog.EMBEDDED:  # read from its arrays (`get_info`), never through tfds
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


def info_from_builder(builder: tfds.core.DatasetBuilder) -> DatasetInfo:
  info = builder.info
  image_key, label_key = _supervised_keys(info)
  features = info.features
  return DatasetInfo(
      name=info.name,
      data_dir=str(builder.data_dir),
      num_classes=int(features[label_key].num_classes),
      image_shape=tuple(features[image_key].shape),
      image_key=image_key,
      label_key=label_key,
      split_sizes={name: split.num_examples for name, split in info.splits.items()},
      tfds_info=info,
      builder=builder,
  )


def _supervised_keys(info: tfds.core.DatasetInfo) -> tuple[str, str]:
  """Returns (image_key, label_key): the supervised keys, else ('image', 'label')."""
  keys = info.supervised_keys
  if isinstance(keys, (tuple, list)) and len(keys) == 2 and all(isinstance(k, str) for k in keys):
    image_key, label_key = keys
  else:
    image_key, label_key = 'image', 'label'
  features = info.features
  if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
    raise UserError(f"dataset '{info.name}' has no image feature '{image_key}' (features: "
                    f"{', '.join(features.keys())}); use an image classification dataset")
  if label_key not in features or not isinstance(features[label_key], tfds.features.ClassLabel):
    raise UserError(f"dataset '{info.name}' has no class-label feature '{label_key}' (features: "
                    f"{', '.join(features.keys())}); use an image classification dataset")
  return image_key, label_key


def _num_examples(info: tfds.core.DatasetInfo, split, name: str) -> int:
  try:
    return int(info.splits[split].num_examples)
  except (KeyError, ValueError, AssertionError) as e:
    raise UserError(f"bad split {str(split)!r} for dataset '{name}' ({_one_line(e)}); use one of "
                    f"{', '.join(info.splits.keys())}, optionally sliced like "
                    f"'train[:90%]' or 'train[1000:]'") from None


def _one_line(error: Exception) -> str:
  return ' '.join(str(error).split())
