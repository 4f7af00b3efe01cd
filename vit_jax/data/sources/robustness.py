"""The ImageNet robustness sets read in place from their releases: ImageNet-v2, ImageNet-R,
ImageNet-A, ImageNet-Sketch and ObjectNet, each one 'test' split.

Each is looked for in `data_dir` as its release unpacks or ships (`SETS`); when it is not there,
the name falls through to the tfds dataset of that name (tfds has `imagenet_v2/<variant>`,
`imagenet_r`, `imagenet_a` and `imagenet_sketch`). The images are indexed once and read where
they are, through the guarded reader of the ImageNet releases (vit_jax/data/releases.py):
  imagenet_v2/<variant>  `imagenetv2-<variant>-format-val/` (folders '0'..'999', the class
                         index), or its tar once decompressed (`gunzip`: a .tar.gz cannot be read
                         at an offset); variants matched-frequency, threshold-0.7, topimages
  imagenet_r, imagenet_a `imagenet-r.tar` / `imagenet-a.tar` as downloaded, or the `imagenet-r/`
                         / `imagenet-a/` folder they unpack into (200 WordNet-id folders each)
  imagenet_sketch        `ImageNet-Sketch.zip` as downloaded (members stored or deflated), or the
                         `sketch/` folder it unpacks into (1,000 WordNet-id folders each)
  objectnet              `objectnet-1.0/` (`images/<folder>/*.png` and `mappings/`), what
                         `objectnet-1.0.zip` unpacks into (its members are encrypted: it is not
                         read in place)
Labels are ImageNet-1k class indices (the 1,000 WordNet ids sorted, as tfds's imagenet2012), so
an ImageNet classifier scores them as they are; ObjectNet's are its 113 classes that overlap
ImageNet (sorted names; the images of its other classes are left out). `Scoring` says which
ImageNet classes a set is scored over and which of the set's classes each one predicts
(vit_jax/evaluate/robustness.py).
"""

import dataclasses
import importlib.util
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax.data import archive
from vit_jax.data import releases
from vit_jax.data.sources import imagenet_subsets
from vit_jax.data.sources import in_place
from vit_jax.errors import UserError

V2_VARIANTS = {'matched-frequency': 'imagenetv2-matched-frequency',
               'threshold-0.7': 'imagenetv2-threshold0.7',
               'topimages': 'imagenetv2-top-images'}
OBJECTNET_MAPPINGS = ('folder_to_objectnet_label.json', 'objectnet_to_imagenet_1k.json',
                      'imagenet_to_label_2012_v2', 'pytorch_to_imagenet_2012_id.json')


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a set's release is under data_dir: its folder (`folder`, holding the class folders
  at `inside`), the tar or zip it ships as (read in place), and the archive that must be
  unpacked."""
  folder: str
  tar: str = ''
  zip: str = ''          # a zip of stored or deflated members, read in place
  packed: str = ''       # an archive that is not read in place (zip, tar.gz)
  unpack: str = ''       # the command that unpacks it
  inside: str = ''       # the class folders' path inside `folder`


def _v2(variant: str) -> Layout:
  stem = V2_VARIANTS[variant]
  return Layout(f'{stem}-format-val', tar=f'{stem}.tar', packed=f'{stem}.tar.gz',
                unpack=f'gunzip {stem}.tar.gz')


SETS: Dict[str, Layout] = {
    **{f'imagenet_v2/{v}': _v2(v) for v in V2_VARIANTS},
    'imagenet_r': Layout('imagenet-r', tar='imagenet-r.tar'),
    'imagenet_a': Layout('imagenet-a', tar='imagenet-a.tar'),
    'imagenet_sketch': Layout('sketch', zip='ImageNet-Sketch.zip'),
    'objectnet': Layout('objectnet-1.0', packed='objectnet-1.0.zip',
                        unpack='unzip objectnet-1.0.zip (its password is on the ObjectNet site)',
                        inside='images'),
}
ALIASES = {'imagenet_v2': 'imagenet_v2/matched-frequency'}  # tfds's default config


def imagenet_wnids() -> Tuple[str, ...]:
  """The 1,000 ImageNet-1k WordNet ids in label order (tfds's imagenet2012 labels file)."""
  spec = importlib.util.find_spec('tensorflow_datasets')
  path = os.path.join(os.path.dirname(spec.origin), 'datasets', 'imagenet2012', 'labels.txt')
  with open(path) as f:
    return tuple(line.strip() for line in f if line.strip())


@dataclasses.dataclass(frozen=True)
class Scoring:
  """How a set is scored: `to_set[i]` is the set's class that ImageNet class i predicts (-1: a
  class outside the set, whose logit is left out before the argmax)."""
  to_set: np.ndarray  # int32 [1000]


def identity_scoring(wnids: Optional[Sequence[str]] = None) -> Scoring:
  """Scoring over the ImageNet classes `wnids` (all 1,000 when None); labels are ImageNet's."""
  order = imagenet_wnids()
  keep = set(order if wnids is None else wnids)
  return Scoring(np.asarray([i if w in keep else -1 for i, w in enumerate(order)], np.int32))


def scoring(name: str) -> Scoring:
  """The scoring of a set whose labels are ImageNet's (all but ObjectNet, whose scoring its
  release's mapping files give)."""
  name = ALIASES.get(name, name)
  if name == 'imagenet_r':
    return identity_scoring(imagenet_subsets.IMAGENET_R)
  if name == 'imagenet_a':
    return identity_scoring(imagenet_subsets.IMAGENET_A)
  return identity_scoring()


class RobustnessSource(in_place.InPlace):
  """A robustness set read in place: one 'test' split of a `releases.Release`."""

  def __init__(self, name: str, release: releases.Release, to_set: Scoring):
    super().__init__(release, name)
    self.scoring = to_set
    # ObjectNet's images have a 1-pixel frame, cropped before evaluation as its authors do.
    self.border = 1 if release.name == 'objectnet' else 0


def load(dataset: str, data_dir: Optional[str]) -> Optional[RobustnessSource]:
  """The set `dataset` read from its release in `data_dir`, or None when the name is no
  robustness set or its release is not there (tfds then looks for a prepared copy)."""
  name = ALIASES.get(dataset, dataset)
  if name not in SETS:
    return None
  root = releases.data_dir_of(data_dir)
  layout = SETS[name]
  folder, tar = os.path.join(root, layout.folder), os.path.join(root, layout.tar)
  if name == 'objectnet' and os.path.isdir(folder):
    release, to_set = _objectnet(folder, root)
  elif os.path.isdir(folder):
    release, to_set = _read(name, folder, 'folders', root), scoring(name)
  elif layout.tar and os.path.isfile(tar):
    release, to_set = _read(name, tar, 'flat_tar', root), scoring(name)
  elif layout.zip and os.path.isfile(os.path.join(root, layout.zip)):
    release, to_set = _read(name, os.path.join(root, layout.zip), 'flat_zip', root), scoring(name)
  elif layout.packed and os.path.exists(os.path.join(root, layout.packed)):
    gives = layout.tar if layout.tar else f'{layout.folder}/'
    raise UserError(f'{os.path.join(root, layout.packed)} cannot be read in place: unpack it '
                    f'once in {root} (`{layout.unpack}`), which gives {gives}')
  else:
    return None
  return RobustnessSource(dataset, release, to_set)


def _read(name: str, path: str, layout: str, data_dir: str) -> releases.Release:
  """The set's release at `path`: its images labelled by their class folder."""
  index = releases.load_index(path, layout, archive.index_base(data_dir))
  wnids = imagenet_wnids()
  label_of = ({str(i): i for i in range(len(wnids))} if name.startswith('imagenet_v2')
              else {w: i for i, w in enumerate(wnids)})
  folders = [_class_folder(index.name(r), layout) for r in range(len(index))]
  unknown = sorted({f for f in folders if f not in label_of})
  if unknown:
    what = 'class indices 0-999' if name.startswith('imagenet_v2') else 'ImageNet WordNet ids'
    raise UserError(f'{path}: {unknown[0]} is none of the {what} ({len(unknown)} such '
                    f'folders): the set\'s images must be in its class folders as released')
  if not folders:
    raise UserError(f'{path} holds no JPEG/PNG image: check that it is the {name} release')
  labels = np.asarray([label_of[f] for f in folders], np.int32)
  rows = np.argsort([index.name(r) for r in range(len(index))], kind='stable').astype(np.int64)
  return releases.Release(name, path, wnids, {'test': releases.Split(index, rows, labels[rows])})


def _class_folder(name: str, layout: str) -> str:
  """The class folder of an indexed image: its unit ('folders'), or the folder that holds it
  in a tar or zip ('imagenet-r/n01443537/x.jpg' -> 'n01443537')."""
  parts = [p for p in name.split('/') if p]
  return parts[0] if layout == 'folders' else (parts[-2] if len(parts) >= 2 else '')


# ---------------------------------------------------------------------------------------------
# ObjectNet: its folders name its classes (folder_to_objectnet_label.json); 113 of them map to
# one or more ImageNet classes by their label text (objectnet_to_imagenet_1k.json, '; '-joined),
# ImageNet's label text per line of imagenet_to_label_2012_v2, and that line per ImageNet index
# (pytorch_to_imagenet_2012_id.json, the sorted-WordNet-id order).


def _mapping_file(mappings: str, name: str):
  path = os.path.join(mappings, name)
  fix = (f'put the mappings/ folder of objectnet-1.0.zip, with {name}, in '
         f'{os.path.dirname(mappings)}')
  if not os.path.exists(path):
    raise UserError(f'ObjectNet\'s mapping file {path} is missing: {fix}')
  try:
    with open(path) as f:
      return json.load(f) if name.endswith('.json') else [line.rstrip('\n') for line in f]
  except (OSError, ValueError) as e:
    raise UserError(f'ObjectNet\'s mapping file {path} cannot be read '
                    f'({" ".join(str(e).split())[:100]}): {fix}') from None


def _objectnet_mappings(root: str) -> Tuple[Dict[str, int], Scoring, List[str]]:
  """({folder: ObjectNet class index}, scoring, class names) of the 113 overlapping classes."""
  mappings = os.path.join(root, SETS['objectnet'].folder, 'mappings')
  folder_label, to_imagenet, lines, line_of = (_mapping_file(mappings, n)
                                               for n in OBJECTNET_MAPPINGS)
  index_of_text = {lines[int(line)].strip(): int(i) for i, line in line_of.items()}
  names = sorted(to_imagenet)
  to_set = np.full(1000, -1, np.int32)
  for k, name in enumerate(names):
    for text in to_imagenet[name].split(';'):
      if text.strip() not in index_of_text:
        raise UserError(f'{os.path.join(mappings, OBJECTNET_MAPPINGS[1])} maps {name!r} to '
                        f'{text.strip()!r}, which no line of {OBJECTNET_MAPPINGS[2]} names: use '
                        f'the mappings/ folder of one objectnet-1.0 release')
      to_set[index_of_text[text.strip()]] = k
  class_of = {folder: names.index(label) for folder, label in folder_label.items()
              if label in to_imagenet}
  return class_of, Scoring(to_set), names


def _objectnet(path: str, data_dir: str) -> Tuple[releases.Release, Scoring]:
  """ObjectNet's images of its 113 ImageNet classes, labelled by those, and its scoring."""
  class_of, to_set, names = _objectnet_mappings(os.path.dirname(path))
  images = os.path.join(path, SETS['objectnet'].inside)
  if not os.path.isdir(images):
    raise UserError(f'{images} does not exist: unpack objectnet-1.0.zip in '
                    f'{os.path.dirname(path)} so that objectnet-1.0/images/ holds its folders')
  index = releases.load_index(images, 'folders', archive.index_base(data_dir))
  folders = [_class_folder(index.name(r), 'folders') for r in range(len(index))]
  rows = np.asarray(sorted((r for r, f in enumerate(folders) if f in class_of),
                           key=index.name), np.int64)
  labels = np.asarray([class_of[folders[r]] for r in rows], np.int32)
  return releases.Release('objectnet', images, tuple(names),
                          {'test': releases.Split(index, rows, labels)}), to_set


__all__ = ['ALIASES', 'OBJECTNET_MAPPINGS', 'SETS', 'Layout', 'RobustnessSource', 'Scoring',
           'V2_VARIANTS', 'identity_scoring', 'imagenet_wnids', 'load', 'scoring']
