"""`digits`: scikit-learn's 1,797 handwritten digits (8x8, grey), read in place from their arrays.

Source: `sklearn.datasets.load_digits()` (UCI optical recognition of handwritten digits; pixel
values 0..16, stored here as round(v * 255 / 16) in uint8). Nothing is downloaded: the data ships
with scikit-learn.

Split (fixed, independent of any seed): for each class, in file order, the first round(0.8 n)
images -> 'train', the rest -> 'test' (1,438 train / 359 test).

Used at higher resolution (`pp.eval='resize'`, `image_size=32`: bilinear upsampling) as a
second small dataset, e.g. to fine-tune a model pre-trained on mnist5k at another resolution.
"""

import numpy as np

from vit_jax.data import embedded

NAME = 'digits'
NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8, 1)
SPLIT_SIZES = {'train': 1438, 'test': 359}  # checked when the arrays are read
HOMEPAGE = 'https://scikit-learn.org/stable/modules/generated/sklearn.datasets.load_digits.html'
DESCRIPTION = "scikit-learn's 8x8 digits; 80/20 per class in file order (see module docstring)."
TRAIN_FRACTION = 0.8


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [1797, 8, 8, 1], labels int64 [1797]) in scikit-learn's order."""
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  data = load_digits()
  images = np.round(data.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  return images, data.target.astype(np.int64)


def split_indices(labels: np.ndarray) -> dict[str, np.ndarray]:
  """{'train': rows, 'test': rows} of `load_arrays()`, ascending (the rule of the docstring)."""
  return embedded.split_per_class(labels, NUM_CLASSES, lambda n: int(round(TRAIN_FRACTION * n)))
