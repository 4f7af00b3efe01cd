"""Your own images: `dataset='folder:/path/to/images'`, a folder of class sub-folders.

Layout: PATH/<class name>/**/<file>.jpg|.jpeg|.png (extensions in any case; images in nested
folders belong to the class folder above them). Label i is the i-th class folder name in sorted
order. Names starting with '.' (hidden files and folders) are ignored.

Preparation, once per folder content: every file is listed; files without a JPEG/PNG extension
("non-image"), files that `preprocess.decode` (the op the input pipelines use) cannot decode
("corrupt") and entries that cannot be read ("unreadable": dangling symbolic links, symbolic-link
loops, no read permission) are skipped, and the counts and first names are printed as one line
on stderr and kept in the dataset's metadata (`info.metadata`: `skipped_non_image`,
`skipped_corrupt`, `skipped_unreadable`). Names that are not valid UTF-8 are used, shown with
backslash escapes (`shown`: class names too). Running out of disk space while writing the
prepared copy is one UserError line. The
other files are written, bytes unchanged, as a tfds dataset in
`<data_dir>/image_folders/<folder name>-<fingerprint>` (data_dir: the config's `data_dir`, else
tfds' default `~/tensorflow_datasets`). The fingerprint hashes every file's relative path, size
and modification time, so a changed folder is prepared again into a new directory (a run resumed
after such a change reads the new contents).

Split, deterministic: within each class, files are ordered by the SHA-256 of their path relative
to PATH; the first round(n / 10) (half up; at least 1 when n >= 2, none when n = 1) form 'test'
and the rest 'train'. Any tfds split string works on them ('train[:50%]', 'train+test').

`load_builder` returns the prepared tfds builder, so the trainer and the pipelines use the folder
like any tfds dataset: the same preprocessing, per-process sharding (`tfds.even_splits`) and
exactly resumable train streams. An empty folder, a single class, or a class folder without one
readable image is a `UserError`.
"""

import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from etils import epath
import tensorflow_datasets as tfds

from vit_jax import errors
from vit_jax import fileio
from vit_jax import quiet
from vit_jax.data import catalog
from vit_jax.data.image_files import shown
from vit_jax.data.offline_info import OfflineDatasetInfo
from vit_jax.errors import UserError

PREFIX = catalog.FOLDER_PREFIX
EXTENSIONS = ('.jpg', '.jpeg', '.png')
TEST_FRACTION = 0.1
NAME = 'vit_jax_image_folder'
_CACHE = 'image_folders'
_SHOWN = 3  # file names shown per kind in the skip summary


@dataclasses.dataclass(frozen=True)
class Listing:
  """What is in a folder: class names, candidate image files (relative path, label), others."""
  root: str
  classes: Tuple[str, ...]
  images: Tuple[Tuple[str, int], ...]
  non_images: Tuple[str, ...]
  fingerprint: str
  unreadable: Tuple[str, ...] = ()  # entries that cannot be read (see `list_folder`)


def list_folder(root: str) -> Listing:
  """Lists PATH/<class>/** without reading any file; UserError if there is no usable layout.

  Entries that cannot be read are skipped and listed in `unreadable`: dangling symbolic links,
  symbolic-link loops (a folder reached a second time, e.g. through a link to a parent), folders
  or files without read permission, anything that is neither a file nor a folder.
  """
  where = f'{PREFIX}{root}'
  if not os.path.isdir(root):
    what = 'is not a directory' if os.path.exists(root) else 'does not exist'
    raise UserError(f'{where}: {root} {what}; give a folder with one sub-folder of JPEG/PNG '
                    'images per class')
  classes, non_images, stats, unreadable = [], [], [], []
  seen = {_identity(root)}
  for entry, kind in _entries(root, '', seen, unreadable):
    if kind == 'dir':
      classes.append(entry)
    else:
      non_images.append(entry)  # not inside a class folder
      stats.append(_stat(root, entry))
  if not classes:
    raise UserError(f'{where} has no class sub-folders: put the images in {root}/<class name>/ '
                    '(one sub-folder per class, JPEG or PNG files)')
  if len(classes) == 1:
    raise UserError(f'{where} has one class sub-folder ({shown(classes[0])}): a classifier needs '
                    'at least two; add a sub-folder of images per class')
  images = []
  for label, name in enumerate(classes):
    for rel in _files_under(root, name, seen, unreadable):
      stats.append(_stat(root, rel))
      if rel.lower().endswith(EXTENSIONS):
        images.append((rel, label))
      else:
        non_images.append(rel)
  listed = [NAME, 1, classes, sorted(stats)] + ([sorted(unreadable)] if unreadable else [])
  digest = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
  return Listing(root=root, classes=tuple(classes), images=tuple(images),
                 non_images=tuple(sorted(non_images)), fingerprint=digest[:16],
                 unreadable=tuple(sorted(unreadable)))


def _identity(path: str) -> Tuple[int, int]:
  st = os.stat(path)
  return st.st_dev, st.st_ino


def _entries(root: str, rel_dir: str, seen: set, unreadable: list):
  """(relative path, 'dir' | 'file') of the non-hidden entries of root/rel_dir, sorted; folders
  seen before (loops) and entries that cannot be read are appended to `unreadable` instead."""
  prefix = f'{rel_dir}/' if rel_dir else ''
  try:
    entries = sorted(os.scandir(os.path.join(root, rel_dir) if rel_dir else root),
                     key=lambda e: e.name)
  except OSError:
    unreadable.append(rel_dir)
    return
  for entry in entries:
    if entry.name.startswith('.'):
      continue
    rel = prefix + entry.name
    try:
      if entry.is_dir():  # follows symbolic links
        identity = _identity(entry.path)
        if identity in seen:
          unreadable.append(rel)  # a loop, or a second way into a folder listed already
          continue
        seen.add(identity)
        yield rel, 'dir'
      elif entry.is_file():
        yield rel, 'file'
      else:
        unreadable.append(rel)  # a dangling or looping link, a socket, a device, ...
    except OSError:
      unreadable.append(rel)


def _files_under(root: str, name: str, seen: set, unreadable: list) -> List[str]:
  """Relative '/'-joined paths of the readable non-hidden files under root/name, sorted."""
  out, pending = [], [name]
  while pending:
    for rel, kind in _entries(root, pending.pop(), seen, unreadable):
      (pending if kind == 'dir' else out).append(rel)
  return sorted(out)


def _stat(root: str, rel: str) -> Tuple[str, int, int]:
  st = os.stat(os.path.join(root, rel))
  return rel, st.st_size, st.st_mtime_ns


def find_corrupt(root: str, rels: Sequence[str]) -> List[str]:
  """The files among `rels` that the input pipeline's decoder cannot decode."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top

  def corrupt(rel: str) -> bool:
    try:
      with open(os.path.join(root, rel), 'rb') as f:
        data = f.read()
      preprocess.decode(tf.constant(data), 3)
      return False
    except (tf.errors.InvalidArgumentError, OSError, ValueError):
      return True

  # libjpeg reports what is wrong with a corrupt file on fd 2; the summary line says it instead.
  with quiet.silenced_stderr(), concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    flags = list(pool.map(corrupt, rels))
  return [rel for rel, bad in zip(rels, flags) if bad]


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


class ImageFolder(tfds.core.GeneratorBasedBuilder):
  """A folder of class sub-folders as a tfds dataset (see the module docstring)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Image bytes as stored; 10% per-class test split by path hash.'}

  def __init__(self, *, listing: Listing, corrupt: Sequence[str] = (), **kwargs):
    self._listing = listing
    self._corrupt = frozenset(corrupt)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return OfflineDatasetInfo(
        builder=self,
        description=f'Images of {self._listing.root} (vit_jax.data.folder).',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(None, None, 3)),
            'label': tfds.features.ClassLabel(names=[shown(c) for c in self._listing.classes]),
            'path': tfds.features.Text(),
        }),
        supervised_keys=('image', 'label'),
        metadata=tfds.core.MetadataDict(source=self._listing.root,
                                        fingerprint=self._listing.fingerprint, **self._skipped()),
    )

  def _skipped(self) -> dict:
    """What preparation skipped (shown names), kept in the dataset's metadata."""
    skipped = {'skipped_corrupt': sorted(self._corrupt),
               'skipped_non_image': list(self._listing.non_images)}
    if self._listing.unreadable:
      skipped['skipped_unreadable'] = list(self._listing.unreadable)
    return {key: [shown(name) for name in names] for key, names in skipped.items()}

  # As mnist5k: name the source file directly (tfds 4.9.10 would need importlib_resources).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    valid = [(rel, label) for rel, label in self._listing.images if rel not in self._corrupt]
    return {name: self._generate_examples(items)
            for name, items in assign_splits(valid).items() if items}

  def _generate_examples(self, items):
    for rel, label in items:
      with open(os.path.join(self._listing.root, rel), 'rb') as f:
        yield shown(rel), {'image': f.read(), 'label': label, 'path': shown(rel)}


def cache_dir(listing: Listing, data_dir: Optional[str]) -> str:
  base = data_dir or tfds.core.constants.DATA_DIR
  slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(listing.root)))
  return os.path.join(base, _CACHE, f'{slug or "root"}-{listing.fingerprint}')


def _summary(names: Sequence[str], what: str, noun: str) -> str:
  listed = ', '.join(names[:_SHOWN]) + (', ...' if len(names) > _SHOWN else '')
  nouns = {'file': 'files', 'entry': 'entries'}[noun] if len(names) != 1 else noun
  return f'{len(names)} {what} {nouns} ({listed})'


def prepare(root: str, data_dir: Optional[str]) -> ImageFolder:
  """The prepared builder of the folder at `root`, preparing it first if its content is new."""
  root = os.path.abspath(os.path.expanduser(root))
  listing = list_folder(root)
  directory = cache_dir(listing, data_dir)
  builder = ImageFolder(listing=listing, data_dir=directory)
  if builder.is_prepared():
    return builder

  corrupt = find_corrupt(root, [rel for rel, _ in listing.images])
  bad = set(corrupt)
  counts = [0] * len(listing.classes)
  for rel, label in listing.images:
    counts[label] += rel not in bad
  empty = [name for name, n in zip(listing.classes, counts) if not n]
  unreadable = f' and {len(listing.unreadable)} unreadable entries' if listing.unreadable else ''
  if empty:
    raise UserError(f'{PREFIX}{root}: class folder {shown(empty[0])} has no readable JPEG/PNG '
                    f'image{f" ({len(empty)} such folders)" if len(empty) > 1 else ""} '
                    f'({len(corrupt)} corrupt and {len(listing.non_images)} non-image files'
                    f'{unreadable} skipped in the folder): add images or remove the folder')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (imported by find_corrupt already)
  builder = ImageFolder(listing=listing, corrupt=corrupt, data_dir=directory)
  config = tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP)
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # tfds' "Downloading and preparing" banner
      builder.download_and_prepare(download_config=config)
  except (OSError, tf.errors.OpError) as e:
    # Another process may have prepared the same directory first (our final rename then fails).
    if not ImageFolder(listing=listing, data_dir=directory).is_prepared():
      if errors.environment_errno(e) not in (None, errno.ENOSPC, errno.EDQUOT):
        # Not the disk's room (a name too long, permissions): the fix for that cause.
        raise UserError(f'cannot prepare {PREFIX}{root} in {directory}: '
                        f'{errors.environment_failure(e)}') from None
      raise UserError(f'cannot prepare {PREFIX}{root} in {directory} ({fileio.error_reason(e)}): '
                      f'free space there or set config.data_dir to a disk with room, then '
                      f'rerun') from None
  builder = ImageFolder(listing=listing, data_dir=directory)
  splits = {name: split.num_examples for name, split in builder.info.splits.items()}
  line = (f'prepared {PREFIX}{root}: {len(listing.classes)} classes, '
          f'{sum(splits.values())} images ({", ".join(f"{n} {s}" for s, n in splits.items())})')
  skips = [_summary([shown(n) for n in names], what, noun) for names, what, noun in (
      (corrupt, 'corrupt', 'file'), (listing.non_images, 'non-image', 'file'),
      (listing.unreadable, 'unreadable', 'entry')) if names]
  line += f'; skipped {" and ".join(skips)}' if skips else '; no file skipped'
  print(f'{line}; cached in {directory}', file=sys.stderr, flush=True)
  return builder


def load_builder(dataset: str, data_dir: Optional[str]) -> ImageFolder:
  """`dataset` is 'folder:PATH'."""
  root = dataset[len(PREFIX):]
  if not root:
    raise UserError(f"dataset {dataset!r} names no folder: use 'folder:/path/to/images'")
  return prepare(root, data_dir)
