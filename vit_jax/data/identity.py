"""What a run records of its dataset with each checkpoint: the class names, the split sizes and a
fingerprint of the prepared files, read from the dataset's info (`vit_jax.data.get_info`, which
the run resolves once), so that a resume on changed data is noticed and a checkpoint's
predictions carry the names it was trained with (not the names the folder has now).

  identify(info) -> {'class_names', 'split_sizes', 'fingerprint'} or None
  changes(recorded, current)  -> what differs, in words ("class 'apple' renamed to 'zucchini'")

The fingerprint hashes the class names, the split sizes and, for a tfds dataset, the name and size
of every prepared file (not their bytes: reading a large dataset at every start would cost
minutes); for a source read in place (a folder, an ImageNet release), the content digest of its
index instead (`content`: every image's name, size and the CRC-32 of all its bytes, computed
once at indexing, and the splits' rows and labels; vit_jax/data/archive/), so another archive
with the same classes and counts, or an image changed in place, is other data. Where the data
lives (`data_dir`, a copy on another disk) is no part of it. An identity recorded without a
content digest, or with one of another checksum (`checksum`), is checked on its class names and
split sizes.
"""

import hashlib
import json
import os
from typing import List, Optional


def _class_names(info) -> Optional[List[str]]:
  try:
    names = info.class_names
  except AttributeError:  # a tfds label feature without names
    return None
  return [str(n) for n in names] if names else None


def _prepared_files(directory: str) -> List[list]:
  """[name, size] of the prepared record files (metadata JSON left out: tfds rewrites it)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  root = epath.Path(directory)
  if not root.is_dir():
    return []
  return sorted([p.name, p.stat().length] for p in root.iterdir()
                if p.is_file() and not p.name.endswith('.json'))


def identify(info) -> Optional[dict]:
  """The identity of a dataset from its info (`vit_jax.data.DatasetInfo`): its source's own
  (`identity()`; None for an embedded dataset, which installed packages carry), else
  `of_files`; None when there is no dataset (a run that needs no data: compile-only, a dataset
  named only by its class count)."""
  if info is None:
    return None
  own = getattr(info.source, 'identity', None)
  return own() if own is not None else of_files(info.source)


def _named(source) -> dict:
  return {'class_names': _class_names(source),
          'split_sizes': {str(k): int(v) for k, v in sorted(source.split_sizes.items())}}


def _with_fingerprint(identity: dict, hashed: dict) -> dict:
  identity['fingerprint'] = hashlib.sha256(
      json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:16]
  return identity


def of_files(source) -> dict:
  """Class names and split sizes, fingerprinted with the names and sizes of the prepared files
  in the source's `data_dir` (a tfds dataset's); a source without one ('') is known by its
  names and sizes."""
  identity = _named(source)
  files = _prepared_files(os.fspath(source.data_dir)) if source.data_dir else []
  return _with_fingerprint(identity, dict(identity, files=files))


def of_content(source) -> dict:
  """Class names, split sizes and the content digest of a source read in place (its `release`:
  a folder, an ImageNet release), fingerprinted together."""
  identity = dict(_named(source), content=source.release.content,
                  checksum=source.release.checksum)
  return _with_fingerprint(identity, dict(identity))


def changes(recorded: Optional[dict], current: Optional[dict]) -> List[str]:
  """What differs between two identities, in words; [] when either is unknown or they match."""
  if not recorded or not current or recorded.get('fingerprint') == current.get('fingerprint'):
    return []
  # recorded without a digest, or with a digest of another checksum
  legacy = 'content' in current and ('content' not in recorded or
                                     recorded.get('checksum') != current.get('checksum'))
  out = []
  old, new = recorded.get('class_names') or [], current.get('class_names') or []
  if old != new:
    gone, added = [n for n in old if n not in new], [n for n in new if n not in old]
    if len(gone) == len(added) and gone:
      out += [f'class {a!r} renamed to {b!r}' for a, b in zip(gone, added)]
    else:
      out += [f'class {n!r} removed' for n in gone] + [f'class {n!r} added' for n in added]
      if not gone and not added:
        out.append('the classes are in another order')
  old_sizes, new_sizes = recorded.get('split_sizes') or {}, current.get('split_sizes') or {}
  for split in sorted(set(old_sizes) | set(new_sizes)):
    if old_sizes.get(split) != new_sizes.get(split):
      out.append(f'{split} split {old_sizes.get(split, 0)} -> {new_sizes.get(split, 0)} images')
  if legacy or out:
    return out
  if 'content' in current:
    return [f'the images changed (the same classes and split sizes, other files: content '
            f'{recorded["content"]} -> {current["content"]})']
  return [f'its contents changed (fingerprint {recorded.get("fingerprint")} -> '
          f'{current.get("fingerprint")})']


__all__ = ['changes', 'identify', 'of_content', 'of_files']
