"""Your own images: `dataset='folder:/path/to/images'`, a folder of class sub-folders.

Layout: PATH/<class name>/**/<file>.jpg|.jpeg|.png (extensions in any case; images in nested
folders belong to the class folder above them). Label i is the i-th class folder name in sorted
order. Names starting with '.' (hidden files and folders) are ignored.

Preparation, once per folder content: every file is listed; files without a JPEG/PNG extension
("non-image") and files that `preprocess.decode` (the op the input pipelines use) cannot decode
("corrupt") are skipped, and the counts and first names are printed as one line on stderr and
kept in the dataset's metadata (`info.metadata`: `skipped_non_image`, `skipped_corrupt`). The
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
import hashlib
import io
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from etils import epath
import tensorflow_datasets as tfds

from vit_jax import quiet
from vit_jax.errors import UserError

PREFIX = 'folder:'
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


def list_folder(root: str) -> Listing:
  """Lists PATH/<class>/** without reading any file; UserError if there is no usable layout."""
  where = f'{PREFIX}{root}'
  if not os.path.isdir(root):
    what = 'is not a directory' if os.path.exists(root) else 'does not exist'
    raise UserError(f'{where}: {root} {what}; give a folder with one sub-folder of JPEG/PNG '
                    'images per class')
  classes, non_images, stats = [], [], []
  for entry in sorted(os.scandir(root), key=lambda e: e.name):
    if entry.name.startswith('.'):
      continue
    if entry.is_dir():
      classes.append(entry.name)
    else:
      non_images.append(entry.name)  # not inside a class folder
      stats.append(_stat(root, entry.name))
  if not classes:
    raise UserError(f'{where} has no class sub-folders: put the images in {root}/<class name>/ '
                    '(one sub-folder per class, JPEG or PNG files)')
  if len(classes) == 1:
    raise UserError(f'{where} has one class sub-folder ({classes[0]}): a classifier needs at least '
                    'two; add a sub-folder of images per class')
  images = []
  for label, name in enumerate(classes):
    for rel in _files_under(root, name):
      stats.append(_stat(root, rel))
      if rel.lower().endswith(EXTENSIONS):
        images.append((rel, label))
      else:
        non_images.append(rel)
  digest = hashlib.sha256(json.dumps([NAME, 1, classes, sorted(stats)]).encode()).hexdigest()
  return Listing(root=root, classes=tuple(classes), images=tuple(images),
                 non_images=tuple(sorted(non_images)), fingerprint=digest[:16])


def _files_under(root: str, name: str) -> List[str]:
  """Relative '/'-joined paths of the non-hidden files under root/name, sorted."""
  out = []
  for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
    rel_dir = os.path.relpath(dirpath, root).replace(os.sep, '/')
    out += [f'{rel_dir}/{f}' for f in filenames if not f.startswith('.')]
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
    ordered = sorted(rels, key=lambda r: hashlib.sha256(r.encode()).hexdigest())
    k = num_test(len(ordered))
    splits['test'] += [(r, label) for r in ordered[:k]]
    splits['train'] += [(r, label) for r in ordered[k:]]
  return splits


class ImageFolder(tfds.core.GeneratorBasedBuilder):
  """A folder of class sub-folders as a tfds dataset (see the module docstring)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Image bytes as stored; 10% per-class test split by path hash.'}

  def __init__(self, *, listing: Listing, skipped: Optional[dict] = None, **kwargs):
    self._listing = listing
    self._skipped = skipped or {}
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=f'Images of {self._listing.root} (vit_jax.data.folder).',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(None, None, 3)),
            'label': tfds.features.ClassLabel(names=list(self._listing.classes)),
            'path': tfds.features.Text(),
        }),
        supervised_keys=('image', 'label'),
        metadata=tfds.core.MetadataDict(source=self._listing.root,
                                        fingerprint=self._listing.fingerprint, **self._skipped),
    )

  # As mnist5k: name the source file directly (tfds 4.9.10 would need importlib_resources).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    corrupt = set(self._skipped.get('skipped_corrupt', ()))
    valid = [(rel, label) for rel, label in self._listing.images if rel not in corrupt]
    return {name: self._generate_examples(items)
            for name, items in assign_splits(valid).items() if items}

  def _generate_examples(self, items):
    for rel, label in items:
      with open(os.path.join(self._listing.root, rel), 'rb') as f:
        yield rel, {'image': f.read(), 'label': label, 'path': rel}


def cache_dir(listing: Listing, data_dir: Optional[str]) -> str:
  base = data_dir or tfds.core.constants.DATA_DIR
  slug = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(listing.root)))
  return os.path.join(base, _CACHE, f'{slug or "root"}-{listing.fingerprint}')


def _summary(names: Sequence[str], what: str) -> str:
  shown = ', '.join(names[:_SHOWN]) + (', ...' if len(names) > _SHOWN else '')
  return f'{len(names)} {what} file{"s" if len(names) != 1 else ""} ({shown})'


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
  if empty:
    raise UserError(f'{PREFIX}{root}: class folder {empty[0]} has no readable JPEG/PNG image'
                    f'{f" ({len(empty)} such folders)" if len(empty) > 1 else ""} '
                    f'({len(corrupt)} corrupt and {len(listing.non_images)} non-image files '
                    'skipped in the folder): add images or remove the folder')
  skipped = {'skipped_corrupt': corrupt, 'skipped_non_image': list(listing.non_images)}
  builder = ImageFolder(listing=listing, skipped=skipped, data_dir=directory)
  config = tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP)
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # tfds' "Downloading and preparing" banner
      builder.download_and_prepare(download_config=config)
  except OSError:
    # Another process may have prepared the same directory first (our final rename then fails).
    if not ImageFolder(listing=listing, data_dir=directory).is_prepared():
      raise
  builder = ImageFolder(listing=listing, data_dir=directory)
  splits = {name: split.num_examples for name, split in builder.info.splits.items()}
  line = (f'prepared {PREFIX}{root}: {len(listing.classes)} classes, '
          f'{sum(splits.values())} images ({", ".join(f"{n} {s}" for s, n in splits.items())})')
  skips = [_summary(names, what) for names, what in
           ((corrupt, 'corrupt'), (list(listing.non_images), 'non-image')) if names]
  line += f'; skipped {" and ".join(skips)}' if skips else '; no file skipped'
  print(f'{line}; cached in {directory}', file=sys.stderr, flush=True)
  return builder


def load_builder(dataset: str, data_dir: Optional[str]) -> ImageFolder:
  """`dataset` is 'folder:PATH'."""
  root = dataset[len(PREFIX):]
  if not root:
    raise UserError(f"dataset {dataset!r} names no folder: use 'folder:/path/to/images'")
  return prepare(root, data_dir)
