"""'imagenet21k' and 'imagenet2012' read in place from their released archives
(vit_jax/data/releases.py), each indexed and checked once per process.

'imagenet2012' is tfds's when a prepared tfds copy of it is in data_dir (that route first) or no
archive of it is found: `load` then returns None and the name goes on to tfds.
"""

import glob
import os
from typing import Optional

from vit_jax.data import releases
from vit_jax.data.sources import in_place

NAMES = releases.NAMES

_RELEASES: dict = {}  # (dataset, data_dir[, 'real']) -> Release: indexed and checked once


def load(dataset: str, data_dir: Optional[str]) -> Optional[in_place.InPlace]:
  if dataset not in NAMES or (dataset == 'imagenet2012' and tfds_prepared(dataset, data_dir)):
    return None
  key = (dataset, data_dir)
  if key not in _RELEASES:
    _RELEASES[key] = releases.find(dataset, data_dir)
  release = _RELEASES[key]
  return in_place.InPlace(release) if release is not None else None


def real_release(dataset: str, data_dir: Optional[str]) -> Optional[releases.Release]:
  """The ImageNet-1k release whose validation images ImageNet ReaL scores, when `dataset` is
  'imagenet2012_real', tfds has no prepared copy of it, and the release's directory holds
  `real.json`; else None (tfds's `imagenet2012_real` is read)."""
  if dataset != 'imagenet2012_real' or tfds_prepared(dataset, data_dir):
    return None
  root = releases.i1k_root(data_dir)
  if root is None or not os.path.exists(os.path.join(root, releases.REAL_LABELS)):
    return None
  key = ('imagenet2012', data_dir, 'real')
  if key not in _RELEASES:
    _RELEASES[key] = releases.imagenet2012(data_dir, root)
  return _RELEASES[key]


def tfds_prepared(dataset: str, data_dir: Optional[str]) -> bool:
  """Whether a tfds copy of `dataset` is prepared in one of tfds's data dirs."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  dirs = [os.path.expanduser(str(d)) for d in tfds.core.utils.file_utils.list_data_dirs(data_dir)]
  return any(glob.glob(os.path.join(glob.escape(d), dataset, '*', 'dataset_info.json'))
             for d in dirs)


__all__ = ['NAMES', 'load', 'real_release', 'tfds_prepared']
