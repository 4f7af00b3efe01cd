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


def repository_root(path: str) -> str:
  """The top directory of the git checkout that holds `path`."""
  return _git(path, 'rev-parse', '--show-toplevel').decode().strip()


def tracked_files(root: str) -> List[str]:
  """The checkout's tracked files that exist, relative to `root` (sorted)."""
  names = [n for n in _git(root, 'ls-files', '-z').decode().split('\0') if n]
  files = sorted(n for n in names if os.path.isfile(os.path.join(root, n)))
  if not files:
    raise UserError(f'{root} has no tracked files to ship: commit (or git add) the code first')
  return files


def _git(where: str, *args: str) -> bytes:
  try:
    return subprocess.run(['git', '-C', where, *args], check=True, capture_output=True).stdout
  except FileNotFoundError:
    raise UserError('--sync ships the tracked files of a git checkout, and git is not '
                    'installed here: install git') from None
  except subprocess.CalledProcessError as e:
    text = ' '.join(e.stderr.decode(errors='replace').split())[:200]
    raise UserError(f'--sync ships the tracked files of a git checkout, and {where} is not in one '
                    f'({text}): run the launcher inside the repository') from None


def write_archive(where: str, dest_dir: str) -> str:
  """A .tar.gz in `dest_dir` of the tracked files of the checkout that holds `where` (from its
  top directory, wherever inside it `where` is); returns its path."""
  root = repository_root(where)
  path = os.path.join(dest_dir, ARCHIVE)
  with tarfile.open(path, 'w:gz') as tar:
    for name in tracked_files(root):
      tar.add(os.path.join(root, name), arcname=name, recursive=False)
  return path


__all__ = ['ARCHIVE', 'repository_root', 'tracked_files', 'write_archive']
