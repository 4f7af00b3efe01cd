"""Any dataset registered with tensorflow-datasets and prepared in data_dir (a local or gs://
path), read through its tfds builder (`info.load_builder`, which never downloads): the source of
every name no other source serves.

Its records are the stored, still encoded images (optionally cached in memory) with their
labels, in the order tfds reads them; its image and label are the dataset's supervised keys, else
'image' and 'label'. Its identity hashes the names and sizes of the prepared files
(`identity.of_files`, the default).
"""

from typing import Optional, Tuple

import tensorflow_datasets as tfds

from vit_jax.errors import UserError


class Tfds:
  """A prepared tfds dataset, read through `builder`."""

  def __init__(self, builder: tfds.core.DatasetBuilder):
    self.builder = builder
    info = builder.info
    self.image_key, self.label_key = _supervised_keys(info)
    features = info.features
    self.name = info.name
    self.data_dir = str(builder.data_dir)
    self.num_classes = int(features[self.label_key].num_classes)
    self.image_shape = tuple(features[self.image_key].shape)
    self.split_sizes = {name: split.num_examples for name, split in info.splits.items()}

  @property
  def class_names(self) -> Tuple[str, ...]:
    return tuple(self.builder.info.features[self.label_key].names)

  def num_examples(self, split) -> int:
    splits = self.builder.info.splits
    try:
      return int(splits[split].num_examples)
    except (KeyError, ValueError, AssertionError) as e:
      raise UserError(f"bad split {str(split)!r} for dataset '{self.name}' "
                      f"({' '.join(str(e).split())}); use one of {', '.join(splits.keys())}, "
                      f"optionally sliced like 'train[:90%]' or 'train[1000:]'") from None

  def records(self, split, cache: bool):
    from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
    label_key = self.label_key
    return pipeline.encoded_records(self.builder, split, self.image_key,
                                    lambda ex: ex[label_key], cache=cache)


def load(dataset: str, data_dir: Optional[str]) -> Tfds:
  """The prepared tfds dataset `dataset`; UserError if tfds does not know it or it is not
  prepared in `data_dir`."""
  from vit_jax.data import info  # pylint: disable=g-import-not-at-top
  return Tfds(info.load_builder(dataset, data_dir))


def _supervised_keys(info: tfds.core.DatasetInfo) -> Tuple[str, str]:
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


__all__ = ['Tfds', 'load']
