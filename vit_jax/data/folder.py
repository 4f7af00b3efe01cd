"""Your own images: `dataset='folder:/path/to/images'`, a folder of class sub-folders read in place.

Layout: PATH/<class name>/**/<file>.jpg|.jpeg|.png (extensions in any case; images in nested
folders belong to the class folder above them). Label i is the i-th class folder name in sorted
order. Names starting with '.' (hidden files and folders) are ignored.

The folder is read where it is, through the index the ImageNet releases use (vit_jax/data/archive/,
layout 'folders'): no copy of the images is written. The index (every image's file, size, class
and checksum: small metadata) is written once per folder content under
`archive.folder_index_base` ($VIT_JAX_INDEX_DIR, else `<data_dir>/vit_jax_index/` when the
config gives a `data_dir`, else `$XDG_CACHE_HOME/vit_jax/index/`, by default
`~/.cache/vit_jax/index/`), in a directory named by the folder's path and a fingerprint of every
file's relative path, size and modification time: a folder changed in any way (a file added,
removed, renamed or rewritten) is indexed again, the indexes of its earlier contents are removed,
and a run resumed after such a change is told that its data changed (vit_jax/data/identity.py).

Indexing lists every file by the rules of vit_jax/data/archive/layouts.py and decodes each image
once with `preprocess.decode` (the op the input pipelines use). An image that decodes while the
decoder prints (libjpeg's "Corrupt JPEG data: ..." lines, which TensorFlow writes to fd 2 at
every decode) is read through a stand-in: a PNG of the same pixels kept in the index directory,
read in its place after the image itself is read and checked as indexed (a stand-in that no
longer matches its recorded CRC-32 is passed over for the image). Skipped, and named in one line
on stderr (counts and first names) and in `Release.skipped`: files without a JPEG/PNG extension
and files beside the class folders ('non_image'), files that do not decode ('corrupt'), entries that
cannot be read ('unreadable': dangling symbolic links, links to a folder that loop or lead out of
their class folder, no read permission, special files), and second names of a file reached
twice through links ('duplicate': the image is read once). A class folder that links to another
class's folder, or one file in two classes, is refused. Names that are not valid UTF-8 are used,
shown with backslash escapes (`shown`: class names too).

Split, deterministic: within each class, files are ordered by the SHA-256 of their path relative
to PATH; the first round(n / 10) (half up; at least 1 when n >= 2, none when n = 1) form 'test'
and the rest 'train'. Any tfds split string works on them ('train[:50%]', 'train+test').

`load` returns the folder as a `releases.Release`, so the trainer and the pipelines read it as
they read the releases: the same preprocessing, per-process sharding and exactly resumable train
streams. An empty folder, a single class, or a class folder without one readable image is a
`UserError`.
"""

import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax import quiet
from vit_jax.data import archive
from vit_jax.data import catalog
from vit_jax.data import releases
from vit_jax.data.image_files import shown
from vit_jax.errors import UserError

PREFIX = catalog.FOLDER_PREFIX
EXTENSIONS = archive.IMAGE_EXTENSIONS
TEST_FRACTION = 0.1
_CHECKED = 'checked.json'  # in the index directory: the images that do not decode, or print
_STAND_INS = 'stand_ins'  # in the index directory: a PNG for each image whose decoding prints
_SHOWN = 3  # file names shown per kind in the skip summary


@dataclasses.dataclass(frozen=True)
class Listing:
  """A folder's class folders (their names as on disk), found without reading any image."""
  root: str
  classes: Tuple[str, ...]


def _root(dataset_or_root: str) -> str:
  root = dataset_or_root[len(PREFIX):] if dataset_or_root.startswith(PREFIX) else dataset_or_root
  return os.path.abspath(os.path.expanduser(root))


def list_folder(root: str) -> Listing:
  """The class folders of PATH; UserError if it is no folder of at least two class folders."""
  where = f'{PREFIX}{root}'
  if not os.path.isdir(root):
    what = 'is not a directory' if os.path.exists(root) else 'does not exist'
    raise UserError(f'{where}: {root} {what}; give a folder with one sub-folder of JPEG/PNG '
                    'images per class')
  units, _ = archive.list_units(root, 'folders')
  classes = tuple(u.name for u in units)
  if not classes:
    raise UserError(f'{where} has no class sub-folders: put the images in {root}/<class name>/ '
                    '(one sub-folder per class, JPEG or PNG files)')
  if len(classes) == 1:
    raise UserError(f'{where} has one class sub-folder ({shown(classes[0])}): a classifier needs '
                    'at least two; add a sub-folder of images per class')
  return Listing(root=root, classes=classes)


_CHUNK = 256  # images decoded together between two looks at what the decoder printed


@dataclasses.dataclass(frozen=True)
class Decoded:
  """What decoding every image of an index found: the rows that do not decode, and the rows that
  decode while the decoder prints on fd 2 (libjpeg's "Corrupt JPEG data: ..." warnings)."""
  corrupt: List[int]
  noisy: List[int]


def check_decodes(index: archive.Index) -> Decoded:
  """Decodes every image of `index` with the input pipeline's decoder, in chunks of `_CHUNK` on
  a thread pool, with fd 2 in a temporary file: a chunk after which the file grew is decoded
  again one image at a time, to find the images that printed."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy, optional)
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  def corrupt(row: int) -> bool:
    data = index.read(row)  # a file changed since it was listed: ReadError, one line
    try:
      preprocess.decode(tf.constant(data), 3)
      return False
    except (tf.errors.InvalidArgumentError, ValueError):
      return True

  bad, noisy = [], []
  with tempfile.TemporaryFile() as printed, quiet.stderr_to(printed), \
      concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    said = lambda: os.fstat(printed.fileno()).st_size
    tf.io.decode_png(tf.io.encode_png(tf.zeros([1, 1, 3], tf.uint8)))  # TensorFlow's start-up lines
    for start in range(0, len(index), _CHUNK):
      rows = range(start, min(start + _CHUNK, len(index)))
      before = said()
      flags = list(pool.map(corrupt, rows))
      bad += [row for row, flag in zip(rows, flags) if flag]
      if said() == before:
        continue
      for row, flag in zip(rows, flags):
        before = said()
        if not flag and not corrupt(row) and said() > before:
          noisy.append(row)
  return Decoded(corrupt=bad, noisy=noisy)


def stand_in(index: archive.Index, row: int) -> bytes:
  """A PNG of the pixels the decoder gives for image `row` (made where it prints, fd 2 silenced):
  read in the image's place, it gives the same pixels without the decoder's lines."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy, optional)
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top  (imports TensorFlow)
  with quiet.silenced_stderr():
    image = preprocess.decode(tf.constant(index.read(row)), 3)
  return tf.io.encode_png(image).numpy()


def num_test(n: int) -> int:
  """Test images of a class with n images: round(n * TEST_FRACTION) half up, >= 1 if n >= 2."""
  if n < 2:
    return 0
  return max(1, int(n * TEST_FRACTION + 0.5))


def assign_splits(images: Sequence[Tuple[str, int]]) -> Dict[str, List[Tuple[str, int]]]:
  """{'train': [(rel, label)], 'test': [...]} by the rule in the module docstring."""
  by_class: Dict[int, List[str]] = {}
  for rel, label in images:
    by_class.setdefault(label, []).append(rel)
  splits = {'train': [], 'test': []}
  for label, rels in sorted(by_class.items()):
    ordered = sorted(rels, key=lambda r: hashlib.sha256(shown(r).encode()).hexdigest())
    k = num_test(len(ordered))
    splits['test'] += [(r, label) for r in ordered[:k]]
    splits['train'] += [(r, label) for r in ordered[k:]]
  return splits


def _checked(index: archive.Index) -> Tuple[List[int], Dict[int, releases.StandIn]]:
  """(corrupt rows, {noisy row: its stand-in PNG and the PNG's CRC-32}) by `check_decodes`, once
  per index: kept in its directory (`_CHECKED` and `_STAND_INS/<row>.png`)."""
  path = os.path.join(index.directory, _CHECKED)
  checked = archive.read_json(path)
  png = lambda row: os.path.join(index.directory, _STAND_INS, f'{row}.png')
  if (isinstance(checked, dict) and checked.get('content') == index.content
      and isinstance(checked.get('stand_ins'), dict)):
    return checked['corrupt'], {int(row): releases.StandIn(png(row), crc)
                                for row, crc in checked['stand_ins'].items()}
  decoded = check_decodes(index)
  stand_ins = {}
  try:
    os.makedirs(os.path.join(index.directory, _STAND_INS), exist_ok=True)
    for row in decoded.noisy:
      data = stand_in(index, row)
      archive.write_file(png(row), data)
      stand_ins[row] = releases.StandIn(png(row), zlib.crc32(data))
    archive.write_json(path, dict(content=index.content, corrupt=decoded.corrupt,
                                  stand_ins={str(r): s.crc32 for r, s in stand_ins.items()}))
  except OSError as e:
    raise UserError(archive.write_failure(e, index.directory)) from None
  return decoded.corrupt, stand_ins


def _skipped(index: archive.Index, corrupt: Sequence[int]) -> Dict[str, Tuple[str, ...]]:
  """What the folder's index left out, by the kinds of the module docstring (shown names)."""
  notes = index.notes
  kinds = {'corrupt': [index.name(r) for r in corrupt],
           'non_image': notes['stray'] + notes['non_image'],
           'unreadable': notes['unreadable'] + notes['not_followed'],
           'duplicate': notes['duplicate']}
  return {kind: tuple(sorted(shown(n) for n in names)) for kind, names in kinds.items() if names}


def _summary(names: Sequence[str], what: str, noun: str) -> str:
  listed = ', '.join(names[:_SHOWN]) + (', ...' if len(names) > _SHOWN else '')
  nouns = {'file': 'files', 'entry': 'entries'}[noun] if len(names) != 1 else noun
  return f'{len(names)} {what} {nouns} ({listed})'


_KINDS = (('corrupt', 'corrupt', 'file'), ('non_image', 'non-image', 'file'),
          ('unreadable', 'unreadable', 'entry'), ('duplicate', 'duplicate', 'file'))


def load(dataset: str, data_dir: Optional[str]) -> releases.Release:
  """The folder `dataset` ('folder:PATH') names, indexed first if its content is new."""
  if dataset == PREFIX:
    raise UserError(f"dataset {dataset!r} names no folder: use 'folder:/path/to/images'")
  root = _root(dataset)
  list_folder(root)  # the folder's own errors first
  index = releases.load_index(root, 'folders', archive.folder_index_base(data_dir), deep=True)
  corrupt, stand_ins = _checked(index)
  skipped = _skipped(index, corrupt)
  valid = np.ones(len(index), bool)
  valid[corrupt] = False
  counts = np.bincount(index.unit[valid], minlength=len(index.units))
  empty = [name for name, n in zip(index.units, counts) if not n]
  if empty:
    if index.built:  # nothing is kept of a folder refused (the index of it is new)
      shutil.rmtree(index.directory, ignore_errors=True)
    unreadable = (f' and {len(skipped["unreadable"])} unreadable entries'
                  if 'unreadable' in skipped else '')
    raise UserError(f'{PREFIX}{root}: class folder {shown(empty[0])} has no readable JPEG/PNG '
                    f'image{f" ({len(empty)} such folders)" if len(empty) > 1 else ""} '
                    f'({len(corrupt)} corrupt and {len(skipped.get("non_image", ()))} non-image '
                    f'files{unreadable} skipped in the folder): add images or remove the folder')
  rows = np.flatnonzero(valid)
  assigned = assign_splits([(index.name(r), int(index.unit[r])) for r in rows])
  in_test = {name for name, _ in assigned['test']}
  order = index.hash_order[valid[index.hash_order]]  # the valid rows in SHA-256 order of names
  test = np.asarray([index.name(r) in in_test for r in order], bool)
  splits = {name: releases.Split(index, order[mask], index.unit[order[mask]].astype(np.int32),
                                   stand_ins)
            for name, mask in (('train', ~test), ('test', test)) if mask.any()}
  release = releases.Release(f'{PREFIX}{root}', root, tuple(shown(c) for c in index.units),
                             splits, skipped)
  if index.built:
    sizes = release.split_sizes
    line = (f'prepared {PREFIX}{root}: {len(release.classes)} classes, {sum(sizes.values())} '
            f'images ({", ".join(f"{n} {s}" for s, n in sizes.items())})')
    skips = [_summary(skipped[kind], what, noun) for kind, what, noun in _KINDS if kind in skipped]
    line += f'; skipped {" and ".join(skips)}' if skips else '; no file skipped'
    print(f'{line}; read in place, indexed in {index.directory}', file=sys.stderr, flush=True)
  return release


__all__ = ['Decoded', 'EXTENSIONS', 'Listing', 'PREFIX', 'TEST_FRACTION', 'assign_splits',
           'check_decodes', 'list_folder', 'load', 'num_test', 'stand_in']
