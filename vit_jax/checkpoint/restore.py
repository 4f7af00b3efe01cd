"""Reading this project's orbax checkpoints back as host numpy arrays, whatever device topology
wrote them: which step directory a --workdir/--checkpoint names, and its params plus the config
stored with them (only the `params` of the train state are read, not the optimizer state), always
in the unrolled layout (vit_jax/models/layout.py).

Used by the analyses, the few-shot CLI and `config.init` (vit_jax.train.transfer).
"""

import os
from typing import Optional, Tuple

import jax
import ml_collections
import numpy as np
from etils import epath

from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.models import layout


def resolve_checkpoint(workdir: Optional[str], checkpoint: Optional[str] = None) -> epath.Path:
  """The step directory (holding `state/` and `config/`) named by --workdir/--checkpoint.

  `checkpoint` is None (the newest step in `<workdir>/checkpoints`), a step number, or the path
  of a step directory (`<workdir>/checkpoints/<step>`, or its `state` subdirectory).
  """
  checkpoint = None if checkpoint in (None, '') else str(checkpoint)
  if checkpoint is not None and not checkpoint.isdigit():
    path = epath.Path(checkpoint)
    if path.name == 'state':
      path = path.parent
    if not (path / 'state').is_dir() or not (path / 'config').is_dir():
      raise UserError(f'--checkpoint={checkpoint} is not a checkpoint step directory (one holding '
                      f'state/ and config/, e.g. WORKDIR/checkpoints/1600): pass such a path or '
                      f'a step number with --workdir')
    return path
  if not workdir:
    raise UserError('missing --workdir: pass --workdir=DIR of a training run (or '
                    '--checkpoint=WORKDIR/checkpoints/STEP)')
  root = epath.Path(workdir)
  if not root.is_dir():
    raise UserError(f'--workdir={workdir} does not exist: pass the --workdir of a training run')
  steps = available_steps(root)
  if not steps:
    raise UserError(f'no checkpoints in {root / "checkpoints"}: train first (python -m '
                    f'vit_jax.main --workdir={workdir} ...) or pass another --workdir')
  if checkpoint is None:
    return root / 'checkpoints' / str(steps[-1])
  if int(checkpoint) not in steps:
    raise UserError(f'no checkpoint for step {int(checkpoint)} in {root / "checkpoints"}: '
                    f'available steps are {", ".join(map(str, steps))}')
  return root / 'checkpoints' / str(int(checkpoint))


def available_steps(workdir) -> list[int]:
  """Steps with a finished checkpoint in `<workdir>/checkpoints` (orbax temp dirs skipped)."""
  directory = epath.Path(workdir) / 'checkpoints'
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and (p / 'state').is_dir() and (p / 'config').is_dir())


def load_checkpoint(step_dir, *, averaged: bool = False) -> Tuple[dict, ml_collections.ConfigDict]:
  """(params as numpy arrays, the run's config) of one checkpoint step directory. The params
  have the official unrolled names (encoderblock_{i}) whether or not the run scanned its encoder.

  averaged=True returns the Polyak average of the params instead (vit_jax/train/polyak.py: what
  the run's evaluations scored) when the run kept one.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step_dir = _absolute(step_dir)  # orbax finds no metadata under a relative path
  with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
    config = ml_collections.ConfigDict(ckptr.restore(step_dir / 'config'))
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


__all__ = ['resolve_checkpoint', 'available_steps', 'load_checkpoint', 'load_facts']
