"""ImageNet-21k and ImageNet-1k as their releases are downloaded, read in place through an index
(`archive_index`): `dataset=imagenet21k`, and `dataset=imagenet2012` when it is not prepared as
a tfds dataset.

ImageNet-21k, under `<data_dir>/imagenet21k/`: the "whole" archive
(`fall11_whole.tar` or `winter21_whole.tar`, a tar of per-synset tars), or the per-synset tars
(`n01440764.tar`, ...) or synset folders it unpacks into. Classes: the synsets found, sorted
(label i = the i-th). One split, 'full', in the order of the SHA-256 of the image names
('n01440764/n01440764_10026.JPEG'): a fixed shuffle, so that its slices are class-balanced and
the same everywhere. big_vision's ImageNet-21k configs train on 'full[51200:]' and evaluate on
part of the held-out first 51,200 images ('full[:25600]'); vit_jax/configs/recipes.py does the same, and
any other slice ('full[:10000]') holds out another number.

ImageNet-1k, under `<data_dir>/imagenet2012/`, `<data_dir>/downloads/manual/` (where tfds wants
its manual downloads) or `<data_dir>`: 'train' from `ILSVRC2012_img_train.tar` (a tar of 1,000
per-synset tars) or a `train/` folder of synset tars or folders; 'validation' from
`ILSVRC2012_img_val.tar` (or a `val/` folder of the 50,000 images) with the devkit's labels:
`ILSVRC2012_validation_ground_truth.txt` (ILSVRC ids, one per image in file-name order) and the
devkit's `meta.mat` (ILSVRC id -> synset), as the devkit archive `ILSVRC2012_devkit_t12.tar.gz`,
its unpacked folder or the two files; or `validation_labels.txt` (one synset per image in
file-name order). Labels: the 1,000 synsets sorted, as tfds's `imagenet2012`. 'train' is in the
SHA-256 order of the names (so 'train[:99%]' is class-balanced), 'validation' in file-name order
(the order ImageNet ReaL's labels follow). A `val/` folder of synset folders needs no label file.

The index is built on first use in `<data_dir>/vit_jax_index/`, in parallel, resumable after a
kill (archive_index.py). The images stay where they are: nothing is copied or decoded up front.
"""

import dataclasses
import io
import json
import os
import sys
import tarfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax.data import archive_index
from vit_jax.data import catalog
from vit_jax.errors import UserError

NAMES = ('imagenet21k', 'imagenet2012')
INDEX_DIR = 'vit_jax_index'
I21K_ARCHIVES = ('winter21_whole.tar', 'fall11_whole.tar')
I1K_TRAIN = 'ILSVRC2012_img_train.tar'
I1K_VAL = 'ILSVRC2012_img_val.tar'
I1K_DEVKIT = 'ILSVRC2012_devkit_t12'
I1K_GROUND_TRUTH = 'ILSVRC2012_validation_ground_truth.txt'
I1K_LABEL_LIST = 'validation_labels.txt'


@dataclasses.dataclass
class Split:
  """The images of one split: index rows in stored order, their labels, and the index."""
  index: archive_index.Index
  rows: np.ndarray    # int64 [n]
  labels: np.ndarray  # int32 [n]


@dataclasses.dataclass
class Release:
  """A dataset read from its release: classes and splits."""
  name: str
  root: str
  classes: Tuple[str, ...]
  splits: Dict[str, Split]

  @property
  def split_sizes(self) -> Dict[str, int]:
    return {name: len(s.rows) for name, s in self.splits.items()}

  def select(self, expression) -> List[Tuple[Split, np.ndarray, np.ndarray]]:
    """[(split, rows, labels)] that a split expression ('full[51200:]', a tfds even split)
    reads, in read order; UserError for an expression that names no split of this dataset."""
    try:
      parts = catalog.parts(expression, self.split_sizes)
    except (ValueError, KeyError, AssertionError) as e:
      raise UserError(f"bad split {str(expression)!r} for dataset '{self.name}' "
                      f"({' '.join(str(e).split())}); use one of {', '.join(self.splits)}, "
                      f"optionally sliced like '{next(iter(self.splits))}[:10000]'") from None
    return [(self.splits[name], self.splits[name].rows[a:b], self.splits[name].labels[a:b])
            for name, a, b in parts]


_ROW_BITS = 40  # a record key is (split number << _ROW_BITS) + index row


def records(release: Release, expression) -> Tuple[np.ndarray, np.ndarray]:
  """(keys int64 [n], labels int32 [n]) of the images a split expression reads, in read order;
  `read(release, keys)` gives their bytes."""
  names = list(release.splits)
  keys, labels = [], []
  for split, rows, split_labels in release.select(expression):
    number = next(i for i, name in enumerate(names) if release.splits[name] is split)
    keys.append((np.int64(number) << _ROW_BITS) + rows.astype(np.int64))
    labels.append(split_labels)
  if not keys:
    return np.zeros([0], np.int64), np.zeros([0], np.int32)
  return np.concatenate(keys), np.concatenate(labels).astype(np.int32)


def key_rows(keys):
  """The index rows of record keys (an int or an int64 array)."""
  return keys & ((1 << _ROW_BITS) - 1)


def _split_row(release: Release, key: int) -> Tuple[Split, int]:
  return release.splits[list(release.splits)[key >> _ROW_BITS]], key_rows(key)


def read(release: Release, keys: np.ndarray) -> List[bytes]:
  """The bytes of the images `keys` (from `records`) name."""
  out = []
  for key in keys.tolist():
    split, row = _split_row(release, key)
    out.append(split.index.read(row))
  return out


def image_name(release: Release, key: int) -> str:
  """The name of the image a record key names ('n01440764/n01440764_10026.JPEG')."""
  split, row = _split_row(release, int(key))
  return split.index.name(row)


def _data_dir(data_dir: Optional[str]) -> str:
  if data_dir:
    return os.path.expanduser(data_dir)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return os.path.expanduser(tfds.core.constants.DATA_DIR)


def _host_shard() -> Tuple[int, int]:
  """(this process, process count) of a JAX job already started, else (0, 1): the hosts of a job
  index their shares of the units."""
  jax = sys.modules.get('jax')
  if jax is None:
    return 0, 1
  try:
    return jax.process_index(), jax.process_count()
  except RuntimeError:
    return 0, 1


def _index(root: str, layout: str, data_dir: str) -> archive_index.Index:
  return archive_index.load(root, layout, os.path.join(data_dir, INDEX_DIR), shard=_host_shard())


def _class_split(index: archive_index.Index, classes: Sequence[str]) -> Split:
  """The images of per-class units, labelled by their unit's place in `classes`, in hash order."""
  label_of = {name: i for i, name in enumerate(classes)}
  unit_labels = np.asarray([label_of[u] for u in index.units], np.int32)
  rows = index.hash_order
  return Split(index, rows, unit_labels[index.unit[rows]] if len(rows) else
               np.zeros([0], np.int32))


def _layout_of(path: str) -> Optional[str]:
  """The per-class layout of a folder: 'tars', 'folders', or None."""
  entries = [e for e in os.scandir(path) if not e.name.startswith('.')]
  if any(e.is_file() and e.name.lower().endswith('.tar') for e in entries):
    return 'tars'
  if any(e.is_dir() for e in entries):
    return 'folders'
  return None


# ---------------------------------------------------------------------------------------------
# ImageNet-21k.


def _i21k_source(data_dir: str) -> Tuple[str, str]:
  """(path, layout) of the ImageNet-21k release under `data_dir`; UserError if none is there."""
  where = os.path.join(data_dir, 'imagenet21k')
  fix = (f'put the "whole" archive ({" or ".join(I21K_ARCHIVES)}: a tar of per-synset tars), the '
         f'per-synset tars or the synset folders in {where}')
  if not os.path.isdir(where):
    raise UserError(f'no ImageNet-21k release under {data_dir} ({where} does not exist): {fix}, '
                    f'or point --config.data_dir at the directory holding imagenet21k/')
  names = sorted(os.listdir(where))
  for archive in I21K_ARCHIVES:
    if archive in names:
      return os.path.join(where, archive), 'tar_of_tars'
  whole = [n for n in names if n.endswith('_whole.tar')]
  if whole:
    return os.path.join(where, whole[0]), 'tar_of_tars'
  compressed = [n for n in names if n.endswith(('.tar.gz', '.tgz'))]
  layout = _layout_of(where)
  if layout:
    return where, layout
  if compressed:
    raise UserError(f'{os.path.join(where, compressed[0])} is gzip-compressed, which cannot be '
                    f'read in place: decompress it once (`gunzip {compressed[0]}`) to a .tar')
  raise UserError(f'unknown layout in {where} ({len(names)} entries, e.g. '
                  f'{", ".join(names[:3]) or "none"}): {fix}')


def imagenet21k(data_dir: Optional[str]) -> Release:
  data_dir = _data_dir(data_dir)
  root, layout = _i21k_source(data_dir)
  index = _index(root, layout, data_dir)
  classes = tuple(sorted(set(index.units)))
  if len(index) == 0:
    raise UserError(f'{root} holds no JPEG/PNG image: check that it is the ImageNet-21k release')
  return Release('imagenet21k', root, classes, {'full': _class_split(index, classes)})


# ---------------------------------------------------------------------------------------------
# ImageNet-1k.


def i1k_root(data_dir: Optional[str]) -> Optional[str]:
  """The first of <data_dir>/imagenet2012, <data_dir>/downloads/manual, <data_dir> holding an
  ImageNet-1k train or validation archive (or train/ val/ folders), else None."""
  data_dir = _data_dir(data_dir)
  for where in (os.path.join(data_dir, 'imagenet2012'),
                os.path.join(data_dir, 'downloads', 'manual'), data_dir):
    if any(os.path.exists(os.path.join(where, n)) for n in (I1K_TRAIN, I1K_VAL)):
      return where
    if os.path.isdir(os.path.join(where, 'train')) and os.path.isdir(os.path.join(where, 'val')):
      return where
  return None


def _i1k_validation_synsets(root: str) -> Optional[List[str]]:
  """The synset of each validation image in file-name order, from the devkit or the list."""
  listed = os.path.join(root, I1K_LABEL_LIST)
  if os.path.exists(listed):
    with open(listed) as f:
      return [line.strip() for line in f if line.strip()]
  files = {}
  for folder in (os.path.join(root, I1K_DEVKIT, 'data'), root):
    for name in (I1K_GROUND_TRUTH, 'meta.mat'):
      if name not in files and os.path.exists(os.path.join(folder, name)):
        with open(os.path.join(folder, name), 'rb') as f:
          files[name] = f.read()
  devkit = os.path.join(root, f'{I1K_DEVKIT}.tar.gz')
  if len(files) < 2 and os.path.exists(devkit):
    with tarfile.open(devkit, 'r:gz') as tar:
      for member in tar:
        name = os.path.basename(member.name)
        if name in (I1K_GROUND_TRUTH, 'meta.mat') and name not in files:
          files[name] = tar.extractfile(member).read()
  if len(files) < 2:
    return None
  import scipy.io  # pylint: disable=g-import-not-at-top
  synsets = scipy.io.loadmat(io.BytesIO(files['meta.mat']), squeeze_me=True)['synsets']
  wnid = {int(s['ILSVRC2012_ID']): str(s['WNID']) for s in synsets}
  return [wnid[int(line)] for line in files[I1K_GROUND_TRUTH].decode().split()]


def imagenet2012(data_dir: Optional[str], root: str) -> Release:
  data_dir = _data_dir(data_dir)
  splits, classes = {}, None
  train = os.path.join(root, I1K_TRAIN)
  if not os.path.exists(train) and os.path.isdir(os.path.join(root, 'train')):
    train = os.path.join(root, 'train')
  if os.path.exists(train):
    layout = 'tar_of_tars' if os.path.isfile(train) else _layout_of(train)
    if layout is None:
      raise UserError(f'unknown layout in {train}: put one tar or folder of images per synset '
                      f'there')
    index = _index(train, layout, data_dir)
    classes = tuple(sorted(set(index.units)))
    splits['train'] = _class_split(index, classes)
  val = os.path.join(root, I1K_VAL)
  if not os.path.exists(val) and os.path.isdir(os.path.join(root, 'val')):
    val = os.path.join(root, 'val')
  if os.path.exists(val):
    splits['validation'] = _i1k_validation(root, val, data_dir, classes)
    if classes is None:
      classes = splits['validation'].classes
    splits['validation'] = splits['validation'].split
  return Release('imagenet2012', root, tuple(classes), splits)


@dataclasses.dataclass
class _Labelled:
  split: Split
  classes: Tuple[str, ...]


def _i1k_validation(root: str, val: str, data_dir: str,
                    classes: Optional[Tuple[str, ...]]) -> _Labelled:
  """The validation images in file-name order with their labels."""
  layout = 'flat_tar' if os.path.isfile(val) else ('folders' if _layout_of(val) == 'folders'
                                                   else 'flat_folder')
  index = _index(val, layout, data_dir)
  rows = np.argsort([index.name(r).rsplit('/', 1)[-1] for r in range(len(index))],
                    kind='stable').astype(np.int64)
  if layout == 'folders':
    synsets = [index.units[u] for u in index.unit[rows]]
  else:
    synsets = _i1k_validation_synsets(root)
    if synsets is None:
      raise UserError(f'no labels for {val}: put the devkit ({I1K_DEVKIT}.tar.gz, or its '
                      f'{I1K_GROUND_TRUTH} and meta.mat) or {I1K_LABEL_LIST} (one synset per '
                      f'image in file-name order) in {root}')
    if len(synsets) != len(rows):
      raise UserError(f'the validation labels in {root} name {len(synsets)} images but {val} '
                      f'holds {len(rows)}: use the label files of the same release')
  classes = classes or tuple(sorted(set(synsets)))
  label_of = {name: i for i, name in enumerate(classes)}
  unknown = sorted(set(synsets) - set(label_of))
  if unknown:
    raise UserError(f'the validation labels in {root} name synsets without training images '
                    f'({", ".join(unknown[:3])}): use the label files of the same release')
  labels = np.asarray([label_of[s] for s in synsets], np.int32).reshape(-1)
  return _Labelled(Split(index, rows, labels), classes)


REAL_LABELS = 'real.json'  # ImageNet ReaL's label sets, one list per validation image


def real_label_sets(release: Release) -> Optional[List[List[int]]]:
  """ImageNet ReaL's label sets of the validation images in file-name order, from `real.json`
  (github.com/google-research/reassessed-imagenet) beside the archives; None if it is absent."""
  path = os.path.join(release.root, REAL_LABELS)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    sets = json.load(f)
  size = len(release.splits['validation'].rows) if 'validation' in release.splits else 0
  if len(sets) != size:
    raise UserError(f'{path} holds {len(sets)} label sets but the validation split has {size} '
                    f'images: use the real.json of the ILSVRC2012 validation set')
  return sets


def find(dataset: str, data_dir: Optional[str]) -> Optional[Release]:
  """The release `dataset` names, read from its archives; None for a dataset this module does
  not read (imagenet2012 only when no archive of it is found: tfds then looks for it)."""
  if dataset == 'imagenet21k':
    return imagenet21k(data_dir)
  if dataset == 'imagenet2012':
    root = i1k_root(data_dir)
    return imagenet2012(data_dir, root) if root else None
  return None


__all__ = ['I1K_TRAIN', 'I1K_VAL', 'NAMES', 'REAL_LABELS', 'real_label_sets', 'Release', 'Split', 'find', 'i1k_root', 'image_name',
           'imagenet2012', 'imagenet21k', 'key_rows', 'read', 'records']
