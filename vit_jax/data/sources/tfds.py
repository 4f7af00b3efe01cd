"""Any dataset registered with tensorflow-datasets and prepared in data_dir (a local or gs://
path), read through its tfds builder (`load_builder`, which never downloads): the source of
every name no other source serves.

Its records are the stored, still encoded images (optionally cached in memory) with their
labels, in the order tfds reads them; its image and label are the dataset's supervised keys, else
'image' and 'label'. Its identity hashes the names and sizes of the prepared files
(`identity.of_files`, the default).
"""

import difflib
import os
from typing import Optional, Tuple, Type

import tensorflow_datasets as tfds

from vit_jax import errors
from vit_jax import fileio
from vit_jax.data import catalog
from vit_jax.data import embedded
from vit_jax.data import info
from vit_jax.data import offline_info
from vit_jax.data import releases
from vit_jax.errors import UserError

# Dataset names listed as examples in the "unknown dataset" message.
_EXAMPLE_NAMES = ('mnist5k', 'digits', 'cifar10', 'cifar100', 'imagenet2012', 'oxford_iiit_pet')


class Tfds:
  """A prepared tfds dataset, read through `builder`."""

  def __init__(self, builder: tfds.core.DatasetBuilder):
    self.builder = builder
    facts = builder.info
    self.image_key, self.label_key = _supervised_keys(facts)
    features = facts.features
    self.name = facts.name
    self.data_dir = str(builder.data_dir)
    self.num_classes = int(features[self.label_key].num_classes)
    self.image_shape = tuple(features[self.image_key].shape)
    self.split_sizes = {name: split.num_examples for name, split in facts.splits.items()}

  @property
  def class_names(self) -> Tuple[str, ...]:
    return tuple(self.builder.info.features[self.label_key].names)

  def num_examples(self, split) -> int:
    splits = self.builder.info.splits
    try:
      return int(splits[split].num_examples)
    except (KeyError, ValueError, AssertionError) as e:
      raise UserError(f"bad split {str(split)!r} for dataset '{self.name}' "
                      f"({info.one_line(e)}); use one of {', '.join(splits.keys())}, "
                      f"optionally sliced like 'train[:90%]' or 'train[1000:]'") from None

  def records(self, split, cache: bool):
    from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
    label_key = self.label_key
    return pipeline.encoded_records(self.builder, split, self.image_key,
                                    lambda ex: ex[label_key], cache=cache)


def load(dataset: str, data_dir: Optional[str]) -> Tfds:
  """The prepared tfds dataset `dataset`; UserError if tfds does not know it or it is not
  prepared in `data_dir`."""
  return Tfds(load_builder(dataset, data_dir))


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
    raise UserError(f"invalid dataset name {dataset!r}: {info.one_line(e)}; give a tfds name "
                    f"such as 'cifar10' or 'cifar10:3.0.2'") from None
  if name.namespace:
    # Community namespaces (huggingface:, kaggle:, ...) resolve over the network.
    raise UserError(f"dataset {dataset!r} has a community namespace '{name.namespace}:', which "
                    f"needs the network; prepare it locally with `tfds build` and pass its plain "
                    f"name and {errors.setting('data_dir')}")
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
    raise UserError(f'cannot open dataset {dataset!r}: {info.one_line(e)}; check the '
                    f'config/version part of the name against the tfds catalog') from None
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
    where += f', the default because {errors.setting("data_dir")} was not given'
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
  fix += f', or point {errors.setting("data_dir")} at a directory where it is prepared'
  return f'dataset {dataset!r} is not prepared: tfds looked in {where}; {fix}'


def _supervised_keys(facts: tfds.core.DatasetInfo) -> Tuple[str, str]:
  """Returns (image_key, label_key): the supervised keys, else ('image', 'label')."""
  keys = facts.supervised_keys
  if isinstance(keys, (tuple, list)) and len(keys) == 2 and all(isinstance(k, str) for k in keys):
    image_key, label_key = keys
  else:
    image_key, label_key = 'image', 'label'
  features = facts.features
  if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
    raise UserError(f"dataset '{facts.name}' has no image feature '{image_key}' (features: "
                    f"{', '.join(features.keys())}); use an image classification dataset")
  if label_key not in features or not isinstance(features[label_key], tfds.features.ClassLabel):
    raise UserError(f"dataset '{facts.name}' has no class-label feature '{label_key}' (features: "
                    f"{', '.join(features.keys())}); use an image classification dataset")
  return image_key, label_key


__all__ = ['Tfds', 'load', 'load_builder']
