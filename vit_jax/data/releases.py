"""ImageNet-21k and ImageNet-1k as their releases are downloaded, read in place through an index
(`vit_jax.data.archive`): `dataset=imagenet21k`, and `dataset=imagenet2012` when it is not
prepared as a tfds dataset.

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

A release is read as it is laid out, or refused (`_per_class_layout`): the classes are the
entries named like synsets ('n' and 8 digits); some synsets as tars and others as folders is
refused in one line naming both kinds; any other entry beside them (a README, a
'backup_n01440764.tar') is a stray, named in a `note:` line and not read. A "whole" archive
beside per-synset tars or folders is the one read (the note names the others). Inside a synset,
links, duplicates and files that are not images follow the rules of
vit_jax/data/archive/layouts.py, each kind named in a `note:` line.

The index is built on first use under `archive.index_base(data_dir)` (`<data_dir>/
vit_jax_index/`, or $VIT_JAX_INDEX_DIR), in parallel, resumable after a kill
(vit_jax/data/archive/building.py).
The images stay where they are: nothing is copied or decoded up front. A devkit, ground truth or
`real.json` that cannot be read is one `UserError` line naming the file.
"""

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import zlib
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from vit_jax import errors
from vit_jax.data import archive
from vit_jax.data import catalog
from vit_jax.data import image_files
from vit_jax.errors import UserError

NAMES = ('imagenet21k', 'imagenet2012')
SYNSET = re.compile(r'n[0-9]{8}')  # a WordNet synset id, the name of an ImageNet class
I21K_ARCHIVES = ('winter21_whole.tar', 'fall11_whole.tar')
I1K_TRAIN = 'ILSVRC2012_img_train.tar'
I1K_VAL = 'ILSVRC2012_img_val.tar'
I1K_DEVKIT = 'ILSVRC2012_devkit_t12'
I1K_GROUND_TRUTH = 'ILSVRC2012_validation_ground_truth.txt'
I1K_LABEL_LIST = 'validation_labels.txt'


@dataclasses.dataclass
class Split:
  """The images of one split: index rows in stored order, their labels, and the index."""
  index: archive.Index
  rows: np.ndarray    # int64 [n]
  labels: np.ndarray  # int32 [n]
  # index row -> a file read in the image's place: the same pixels in a file whose decoding
  # prints nothing (a folder's images that make libjpeg print; vit_jax/data/folder.py)
  stand_ins: Dict[int, 'StandIn'] = dataclasses.field(default_factory=dict)


class StandIn(NamedTuple):
  """A file read in an image's place, and the CRC-32 it had when it was made."""
  path: str
  crc32: int


@dataclasses.dataclass
class Release:
  """A dataset read in place: classes and splits (and, for a folder, what it skipped)."""
  name: str
  root: str
  classes: Tuple[str, ...]
  splits: Dict[str, Split]
  skipped: Dict[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)

  @property
  def split_sizes(self) -> Dict[str, int]:
    return {name: len(s.rows) for name, s in self.splits.items()}

  checksum = archive.CHECKSUM  # of each image's bytes, in `content`

  @property
  def content(self) -> str:
    """A digest of what the splits read: each index's content digest (every image's name, size
    and the CRC-32 of all its bytes; vit_jax/data/archive/) and each split's rows and labels."""
    digest = hashlib.sha256()
    for name, split in sorted(self.splits.items()):
      digest.update(f'{name}\0{split.index.content}\0'.encode())
      digest.update(np.asarray(split.rows, np.int64).tobytes())
      digest.update(np.asarray(split.labels, np.int32).tobytes())
    return digest.hexdigest()[:16]

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
    data = split.index.read(row)  # checked as indexed, whether or not a stand-in is read
    stand_in = split.stand_ins.get(row)
    out.append(data if stand_in is None else _stand_in_or(stand_in, data))
  return out


def _stand_in_or(stand_in: StandIn, image: bytes) -> bytes:
  """The stand-in's bytes; `image` where the stand-in is gone or no longer what was made."""
  try:
    with open(stand_in.path, 'rb') as f:
      data = f.read()
  except OSError:
    return image
  return data if zlib.crc32(data) == stand_in.crc32 else image


def image_name(release: Release, key: int) -> str:
  """The name of the image a record key names ('n01440764/n01440764_10026.JPEG')."""
  split, row = _split_row(release, int(key))
  return split.index.name(row)


def data_dir_of(data_dir: Optional[str]) -> str:
  """`data_dir`, or tfds' default when it is not given."""
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


def is_synset(name: str) -> bool:
  return SYNSET.fullmatch(name) is not None


def load_index(root: str, layout: str, base: str, **kwargs) -> archive.Index:
  """The index of the source at `root` (archive.load) under `base`, its units split over the
  hosts."""
  return archive.load(root, layout, base, shard=_host_shard(), **kwargs)


def _index(root: str, layout: str, data_dir: str) -> archive.Index:
  index = load_index(root, layout, archive.index_base(data_dir), unit_name=is_synset)
  if _host_shard()[0] == 0:
    for line in note_lines(index, 'synset'):
      print(f'note: {line}', file=sys.stderr, flush=True)
  return index


_SHOWN = 3  # names shown per kind of note


def listed(names: Sequence[str]) -> str:
  """'a, b, c' or 'a, b, c, ... (N in all)'."""
  shown = [image_files.shown(n) for n in names[:_SHOWN]]
  return ', '.join(shown) + (f', ... ({len(names)} in all)' if len(names) > _SHOWN else '')


def note_lines(index: archive.Index, unit: str) -> List[str]:
  """What indexing left out of a source, one line per kind (archive.NOTE_KINDS)."""
  what = {  # kind: (one, several, why)
      'stray': (f'entry that is no {unit}', f'entries that are no {unit}', 'not read'),
      'non_image': ('file that is not a JPEG/PNG image', 'files that are not JPEG/PNG images',
                    'left out'),
      'not_followed': ('symbolic link not followed', 'symbolic links not followed',
                       f'a loop, or a link out of its {unit}'),
      'unreadable': ('entry that cannot be read', 'entries that cannot be read', 'left out'),
      'duplicate': ('image that is there twice', 'images that are there twice', 'read once'),
      'unit_twice': (f'{unit} tar stored twice in the archive (appended)',
                     f'{unit} tars stored twice in the archive (appended)', 'the last copy read'),
  }
  lines = []
  for kind in archive.NOTE_KINDS:
    names = index.notes.get(kind)
    if names:
      one, several, why = what[kind]
      lines.append(f'{index.root}: {len(names)} {one if len(names) == 1 else several} ({why}): '
                   f'{listed(names)}')
  return lines


def _class_split(index: archive.Index, classes: Sequence[str]) -> Split:
  """The images of per-class units, labelled by their unit's place in `classes`, in hash order."""
  label_of = {name: i for i, name in enumerate(classes)}
  unit_labels = np.asarray([label_of[u] for u in index.units], np.int32)
  rows = index.hash_order
  return Split(index, rows, unit_labels[index.unit[rows]] if len(rows) else
               np.zeros([0], np.int32))


def _per_class_layout(path: str) -> Optional[str]:
  """The per-class layout of a folder: 'tars' (synset tars), 'folders' (synset folders), or None
  (neither); UserError if it holds both (a release half unpacked)."""
  tars, folders = [], []
  for entry in sorted(os.scandir(path), key=lambda e: e.name):
    if entry.name.startswith('.'):
      continue
    try:
      if entry.is_file() and entry.name.lower().endswith('.tar') and is_synset(entry.name[:-4]):
        tars.append(entry.name)
      elif entry.is_dir() and is_synset(entry.name):
        folders.append(entry.name)
    except OSError:
      continue  # a dangling link: a stray, named when indexing
  if tars and folders:
    both = sorted({t[:-4] for t in tars} & set(folders))
    also = f'; {both[0]} is there as both' if both else ''
    raise UserError(f'{path} holds the synsets in two ways: {len(tars)} as tars ({listed(tars)}) '
                    f'and {len(folders)} as folders ({listed(folders)}){also}: finish unpacking '
                    f'(one folder per synset, the tars removed) or keep only the tars')
  return 'tars' if tars else 'folders' if folders else None


# ---------------------------------------------------------------------------------------------
# ImageNet-21k.


def _i21k_source(data_dir: str) -> Tuple[str, str]:
  """(path, layout) of the ImageNet-21k release under `data_dir`; UserError if none is there."""
  where = os.path.join(data_dir, 'imagenet21k')
  fix = (f'put the "whole" archive ({" or ".join(I21K_ARCHIVES)}: a tar of per-synset tars), the '
         f'per-synset tars or the synset folders in {where}')
  if not os.path.isdir(where):
    raise UserError(f'no ImageNet-21k release under {data_dir} ({where} does not exist): {fix}, '
                    f'or point {errors.setting("data_dir")} at the directory holding imagenet21k/')
  names = sorted(os.listdir(where))
  whole = [a for a in I21K_ARCHIVES if a in names] + [n for n in names if n.endswith('_whole.tar')]
  if whole:
    others = [n for n in names if not n.startswith('.') and n != whole[0]]
    if others:
      print(f'note: reading {whole[0]}; the {len(others)} other entries of {where} are not read: '
            f'{listed(others)}', file=sys.stderr, flush=True)
    return os.path.join(where, whole[0]), 'tar_of_tars'
  compressed = [n for n in names if n.endswith(('.tar.gz', '.tgz'))]
  layout = _per_class_layout(where)
  if layout:
    return where, layout
  if compressed:
    raise UserError(f'{os.path.join(where, compressed[0])} is gzip-compressed, which cannot be '
                    f'read in place: decompress it once (`gunzip {compressed[0]}`) to a .tar')
  raise UserError(f'unknown layout in {where} ({len(names)} entries, e.g. '
                  f'{", ".join(names[:3]) or "none"}): {fix}')


def imagenet21k(data_dir: Optional[str]) -> Release:
  data_dir = data_dir_of(data_dir)
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
  data_dir = data_dir_of(data_dir)
  for where in (os.path.join(data_dir, 'imagenet2012'),
                os.path.join(data_dir, 'downloads', 'manual'), data_dir):
    if any(os.path.exists(os.path.join(where, n)) for n in (I1K_TRAIN, I1K_VAL)):
      return where
    if os.path.isdir(os.path.join(where, 'train')) and os.path.isdir(os.path.join(where, 'val')):
      return where
  return None


def _i1k_validation_synsets(root: str) -> Optional[List[str]]:
  """The synset of each validation image in file-name order, from the devkit or the list."""
  listed_file = os.path.join(root, I1K_LABEL_LIST)
  if os.path.exists(listed_file):
    with open(listed_file, errors='replace') as f:
      synsets = [line.strip() for line in f if line.strip()]
    bad = next((i for i, s in enumerate(synsets) if not is_synset(s)), None)
    if bad is not None:
      raise UserError(f'{listed_file} line {bad + 1} is {synsets[bad][:40]!r}, not a synset id '
                      f'like n01440764: put one synset per validation image there, in file-name '
                      f'order')
    return synsets
  files, where = {}, {}
  for folder in (os.path.join(root, I1K_DEVKIT, 'data'), root):
    for name in (I1K_GROUND_TRUTH, 'meta.mat'):
      if name not in files and os.path.exists(os.path.join(folder, name)):
        with open(os.path.join(folder, name), 'rb') as f:
          files[name] = f.read()
        where[name] = os.path.join(folder, name)
  devkit = os.path.join(root, f'{I1K_DEVKIT}.tar.gz')
  if len(files) < 2 and os.path.exists(devkit):
    try:
      with tarfile.open(devkit, 'r:gz') as tar:
        for member in tar:
          name = os.path.basename(member.name)
          if name in (I1K_GROUND_TRUTH, 'meta.mat') and name not in files and member.isfile():
            files[name] = tar.extractfile(member).read()
            where[name] = f'{devkit}:{member.name}'
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
      raise UserError(f'{devkit} is not a readable .tar.gz ({_reason(e)}): download it again, '
                      f'or put its data/{I1K_GROUND_TRUTH} and data/meta.mat in {root}') from None
  if len(files) < 2:
    return None
  wnid = _devkit_synsets(files['meta.mat'], where['meta.mat'])
  synsets = []
  for number, line in enumerate(files[I1K_GROUND_TRUTH].decode('utf-8', 'replace').split('\n')):
    if not line.strip():
      continue
    try:
      synsets.append(wnid[int(line)])
    except (ValueError, KeyError):
      raise UserError(f'{where[I1K_GROUND_TRUTH]} line {number + 1} is {line.strip()[:40]!r}, '
                      f'not one of the ILSVRC ids 1-{len(wnid)} of its meta.mat: use the '
                      f'ground truth and meta.mat of the same devkit') from None
  return synsets


def _devkit_synsets(data: bytes, where: str) -> Dict[int, str]:
  """{ILSVRC id: synset} of the devkit's meta.mat; UserError if it is not one."""
  import scipy.io  # pylint: disable=g-import-not-at-top  (an optional heavy dependency)
  try:
    synsets = scipy.io.loadmat(io.BytesIO(data), squeeze_me=True)['synsets']
    wnid = {int(s['ILSVRC2012_ID']): str(s['WNID']) for s in synsets}
  except Exception as e:  # pylint: disable=broad-except  # scipy's many ways to refuse a file
    raise UserError(f'{where} is not the devkit\'s meta.mat ({_reason(e)}): download '
                    f'{I1K_DEVKIT}.tar.gz again') from None
  if not wnid or not all(is_synset(s) for s in wnid.values()):
    raise UserError(f'{where} is not the devkit\'s meta.mat (no synset table): download '
                    f'{I1K_DEVKIT}.tar.gz again')
  return wnid


def _reason(error: BaseException) -> str:
  text = ' '.join(str(error).split())[:120]
  return f'{type(error).__name__}: {text}' if text else type(error).__name__


def imagenet2012(data_dir: Optional[str], root: str) -> Release:
  data_dir = data_dir_of(data_dir)
  splits, classes = {}, None
  train = os.path.join(root, I1K_TRAIN)
  if not os.path.exists(train) and os.path.isdir(os.path.join(root, 'train')):
    train = os.path.join(root, 'train')
  if os.path.exists(train):
    layout = 'tar_of_tars' if os.path.isfile(train) else _per_class_layout(train)
    if layout is None:
      raise UserError(f'unknown layout in {train}: put one tar or folder of images per synset '
                      f'(named like n01440764) there')
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
  layout = 'flat_tar' if os.path.isfile(val) else ('folders' if _per_class_layout(val) == 'folders'
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
  fix = 'download real.json of the ILSVRC2012 validation set again'
  try:
    with open(path, 'rb') as f:
      sets = json.loads(f.read())
  except ValueError as e:  # empty, cut short, not JSON, not UTF-8
    raise UserError(f'{path} is not readable JSON ({_reason(e)}): {fix}') from None
  classes = len(release.classes)
  if not isinstance(sets, list) or not all(
      isinstance(s, list) and all(isinstance(c, int) and not isinstance(c, bool)
                                  and 0 <= c < classes for c in s) for s in sets):
    raise UserError(f'{path} is not a list of label sets (lists of class numbers 0-'
                    f'{classes - 1}): {fix}')
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


__all__ = ['I1K_TRAIN', 'I1K_VAL', 'NAMES', 'REAL_LABELS', 'Release', 'SYNSET', 'Split',
           'data_dir_of', 'find', 'i1k_root', 'image_name', 'imagenet2012', 'imagenet21k',
           'is_synset', 'key_rows', 'listed', 'load_index', 'note_lines', 'read',
           'real_label_sets', 'records', 'StandIn']
