"""Reading this project's orbax checkpoints back as host numpy arrays, whatever device topology
wrote them: a step's params (only the `params` of the train state, not the optimizer state),
always in the unrolled layout (vit_jax/models/layout.py), and the config stored with them. Which
step directory a --workdir/--checkpoint names is `steps.resolve_checkpoint` (re-exported here).

Used by the analyses, the few-shot CLI and `config.init` (vit_jax.train.transfer).
"""

import os
import sys
import time
from typing import Callable, Optional, Tuple, TypeVar

import jax
import ml_collections
import numpy as np
from etils import epath

from vit_jax.checkpoint import integrity
from vit_jax.checkpoint import versions
from vit_jax.checkpoint.steps import COMMANDS, INIT, Flags, available_steps, resolve_checkpoint  # pylint: disable=unused-import
from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.models import layout


T = TypeVar('T')
_TRIES = 10  # reads of the newest step of a run that removes each one as it is read
_REMOVAL_WAIT_S = 5.0  # how long a step that a newer one replaced may take to vanish


def read_step(workdir: Optional[str], checkpoint: Optional[str],
              read: Callable[[epath.Path], T], flags: Flags = COMMANDS) -> T:
  """`read(step_dir)` of the step that --workdir/--checkpoint name (`resolve_checkpoint`), safe
  beside the run that writes them. Such a run removes its older checkpoints (it keeps the newest
  `keep_checkpoints`), possibly while one is read: then the newest step is read again (up to
  _TRIES times); a step named by --checkpoint that is removed while read is one line. Without
  --checkpoint, a newest step whose files are damaged (or cannot be verified) is passed over,
  with a note, for the newest healthy one. `flags`: the caller's spelling of the two choices."""
  passed, tries = [], 0
  while True:
    step_dir = resolve_checkpoint(workdir, checkpoint, passed, flags)
    try:
      result = read(step_dir)
      if step_dir.exists():
        return result
      raise FileNotFoundError(f'{step_dir} was removed while it was read')  # (a part may be)
    except Damaged as e:
      if checkpoint not in (None, ''):
        raise
      print(f'note: {e.args[0].split(_ANOTHER)[0]}; reading the newest healthy one',
            file=sys.stderr, flush=True)
      passed.append(int(step_dir.name))
    except Exception:  # pylint: disable=broad-except  # a removed step: read another
      if not _removed(step_dir):
        raise
      if checkpoint not in (None, ''):
        raise UserError(f'checkpoint {step_dir} was removed while it was read (its run keeps '
                        f'only its newest checkpoints): pass a step it keeps, or leave out '
                        f'--checkpoint for the newest') from None
      tries += 1
      if tries == _TRIES:
        raise UserError(f'the newest checkpoint in {step_dir.parent} was removed while it was '
                        f'read, {_TRIES} times in a row (its run saves and removes checkpoints '
                        f'faster than they are read): rerun once the run has stopped, or give it '
                        f'a larger keep_checkpoints') from None


def _removed(step_dir: epath.Path) -> bool:
  """Whether a step that failed to read is gone or going: a run removes a step only once a
  newer one is complete, and its removal takes a moment."""
  deadline = time.monotonic() + _REMOVAL_WAIT_S
  while step_dir.exists():
    try:
      newest = available_steps(step_dir.parent.parent)
    except OSError:
      newest = []
    if not newest or newest[-1] <= int(step_dir.name) or time.monotonic() > deadline:
      return False  # nothing replaced it: its failure is its own
    time.sleep(0.05)
  return True


class Damaged(UserError):
  """A checkpoint whose files do not match its manifest (vit_jax/checkpoint/integrity.py)."""


def load_checkpoint(step_dir, *, averaged: bool = False,
                    flags: Flags = COMMANDS) -> Tuple[dict, ml_collections.ConfigDict]:
  """(params as numpy arrays, the run's config) of one checkpoint step directory. The params
  have the official unrolled names (encoderblock_{i}) whether or not the run scanned its encoder.

  averaged=True returns the Polyak average of the params instead (vit_jax/train/polyak.py: what
  the run's evaluations scored) when the run kept one. The step's files are checked against its
  manifest as they are read (`integrity`): damaged ones, and ones without a manifest, raise
  `Damaged` (its hint spelled with `flags`).
  """
  step_dir = _absolute(step_dir)  # orbax finds no metadata under a relative path
  damaged = integrity.damage(step_dir, large=False)
  if damaged:
    raise _damaged(step_dir, damaged, flags)
  verification = integrity.Verification(step_dir)  # the array data, beside the read
  try:
    try:
      loaded = _read_params(step_dir, averaged)
    except Exception:  # pylint: disable=broad-except  # damaged files say so, anything else raises
      try:
        damaged = verification.result()
      except Exception:  # pylint: disable=broad-except  # cannot tell: the read's own error
        damaged = None
      if damaged:
        raise _damaged(step_dir, damaged, flags) from None
      raise
    damaged = verification.result()
  finally:
    verification.cancel()
  if damaged:
    raise _damaged(step_dir, damaged, flags)
  return loaded


_ANOTHER = ': use another step'


def _damaged(step_dir, what: str, flags: Flags) -> Damaged:
  state = 'cannot be verified' if what == integrity.UNVERIFIED else 'is damaged'
  hint = flags.step_hint(os.path.dirname(os.path.dirname(os.path.normpath(str(step_dir)))))
  return Damaged(f'checkpoint {step_dir} {state} ({what}){_ANOTHER} ({hint}; the '
                 f'training run sets it aside when it resumes)')


def _read_params(step_dir: epath.Path, averaged: bool) -> Tuple[dict, ml_collections.ConfigDict]:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
    stored = ckptr.restore(step_dir / 'config')
    versions.refuse_earlier(stored, str(step_dir))
    config = ml_collections.ConfigDict(stored)
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
    tree = ckptr.metadata(step_dir / 'state').item_metadata.tree
    if 'params' not in tree:
      raise UserError(f'{step_dir / "state"} holds no params (keys: {", ".join(tree)}): pass a '
                      f'checkpoint written by vit_jax.main')
    key = 'opt_state' if averaged and _average_index(tree.get('opt_state')) is not None \
        else 'params'
    item = {key: tree[key]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restored = ckptr.restore(step_dir / 'state', args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
  if key == 'params':
    return layout.unstack_blocks(restored['params']), config
  opt_state = restored['opt_state']
  return layout.unstack_blocks(opt_state[_average_index(opt_state)]['average']), config


def load_facts(step_dir) -> dict:
  """What a checkpoint step recorded of its run's data (`facts`: class count, input shape and,
  where known, the dataset's class names and fingerprint); {} for a checkpoint without it."""
  path = _absolute(step_dir) / 'facts'
  if not path.is_dir():
    return {}
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
    return dict(ckptr.restore(path))


def _absolute(path) -> epath.Path:
  path = str(path)
  return epath.Path(path if is_remote(path) else os.path.abspath(path))


def _average_index(opt_state) -> Optional[int]:
  """Where the optimizer chain keeps the Polyak average (a {'average': ...} entry), if it does."""
  if not isinstance(opt_state, (list, tuple)):
    return None
  found = [i for i, s in enumerate(opt_state) if isinstance(s, dict) and set(s) == {'average'}]
  return found[0] if found else None


__all__ = ['COMMANDS', 'Damaged', 'Flags', 'INIT', 'available_steps', 'load_checkpoint', 'load_facts', 'read_step',
           'resolve_checkpoint']
