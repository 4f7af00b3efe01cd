"""'mnist5k' and 'digits': the datasets inside installed packages, read from their uint8 arrays
in the order tfds would read a prepared copy (vit_jax/data/catalog.py); nothing is encoded,
decoded or written, and, as installed packages carry them, they have no identity to record."""

from typing import Optional

from vit_jax.data import catalog

NAMES = tuple(catalog.EMBEDDED)


class Embedded:
  """An embedded dataset: its module's stated facts (vit_jax/data/mnist5k.py, digits.py)."""

  data_dir = ''  # nothing prepared

  def __init__(self, module):
    self.name, self.num_classes = module.NAME, module.NUM_CLASSES
    self.image_shape = tuple(module.IMAGE_SHAPE)
    self.split_sizes = dict(module.SPLIT_SIZES)
    self.class_names = tuple(str(c) for c in range(self.num_classes))

  def num_examples(self, split) -> int:
    from vit_jax.data import info  # pylint: disable=g-import-not-at-top
    return info.split_count(self.name, split, self.split_sizes, "'train[:90%]' or 'train[1000:]'")

  def records(self, split, cache: bool):
    """tf.data of (uint8 image [H, W, C], int32 label), read from the arrays in place."""
    del cache  # the arrays are in memory already
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    images, labels = catalog.in_read_order(self.name, split)
    return tf.data.Dataset.from_tensor_slices((images, labels))

  def identity(self) -> None:
    return None


def load(dataset: str, data_dir: Optional[str]) -> Optional[Embedded]:
  del data_dir  # read from installed packages
  return Embedded(catalog.EMBEDDED[dataset]) if dataset in catalog.EMBEDDED else None


__all__ = ['Embedded', 'NAMES', 'load']
