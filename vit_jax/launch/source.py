"""What `launch --sync` ships: the tracked files of the local git checkout, as one tarball.

Only `git ls-files` (as they are in the working tree, uncommitted edits included): never `.git`,
`.venv`, `runs/` or anything else untracked. Tracked files deleted locally are left out.
"""

import os
import subprocess
import tarfile
from typing import List

from vit_jax.errors import UserError

ARCHIVE = 'vit_jax_source.tar.gz'


def tracked_files(root: str) -> List[str]:
  """The checkout's tracked files that exist, relative to `root` (sorted)."""
  try:
    out = subprocess.run(['git', '-C', root, 'ls-files', '-z'], check=True, capture_output=True)
  except FileNotFoundError:
    raise UserError('--sync ships the tracked files of a git checkout, and git is not '
                    'installed here: install git') from None
  except subprocess.CalledProcessError as e:
    text = ' '.join(e.stderr.decode(errors='replace').split())[:200]
    raise UserError(f'--sync ships the tracked files of a git checkout, and {root} is not one '
                    f'({text}): run the launcher from the repository root') from None
  names = [n for n in out.stdout.decode().split('\0') if n]
  files = sorted(n for n in names if os.path.isfile(os.path.join(root, n)))
  if not files:
    raise UserError(f'{root} has no tracked files to ship: commit (or git add) the code first')
  return files


def write_archive(root: str, dest_dir: str) -> str:
  """A .tar.gz of `tracked_files(root)` in `dest_dir`; returns its path."""
  path = os.path.join(dest_dir, ARCHIVE)
  with tarfile.open(path, 'w:gz') as tar:
    for name in tracked_files(root):
      tar.add(os.path.join(root, name), arcname=name, recursive=False)
  return path


__all__ = ['ARCHIVE', 'tracked_files', 'write_archive']
