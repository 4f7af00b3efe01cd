"""Which step directory of a run a command reads, found without importing JAX, TensorFlow or
orbax (a missing or empty --workdir is said before them), and the run's evaluator entries as its
stored config names them.

A step directory is `<workdir>/checkpoints/<step>` holding `state/` and `config/` (orbax's
directories; `config/metadata` is the run's config as JSON).
"""

import dataclasses
import json
from typing import Optional, Sequence, Set

from etils import epath

from vit_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Flags:
  """How the command that reads a checkpoint spells its two choices, for the hints of its errors:
  the training run and, within it, the step."""
  workdir: str = '--workdir'
  step: str = '--checkpoint=STEP'  # `{workdir}`: the run's directory where it is known
  step_dir: str = '--checkpoint'  # the flag that takes a step directory

  def step_hint(self, workdir: str = 'WORKDIR') -> str:
    return self.step.format(workdir=workdir)


COMMANDS = Flags()  # predict, export, analyze, fewshot
INIT = Flags(workdir='--config.init', step='--config.init={workdir}/checkpoints/STEP',
             step_dir='--config.init')


def resolve_checkpoint(workdir: Optional[str], checkpoint: Optional[str] = None,
                       passed: Sequence[int] = (), flags: Flags = COMMANDS) -> epath.Path:
  """The step directory (holding `state/` and `config/`) named by --workdir/--checkpoint.

  `checkpoint` is None (the newest step in `<workdir>/checkpoints`, leaving out the steps
  `passed`), a step number, or the path of a step directory (`<workdir>/checkpoints/<step>`, or
  its `state` subdirectory).
  """
  checkpoint = None if checkpoint in (None, '') else str(checkpoint)
  if checkpoint is not None and not checkpoint.isdigit():
    path = epath.Path(checkpoint)
    if path.name == 'state':
      path = path.parent
    if not (path / 'state').is_dir() or not (path / 'config').is_dir():
      raise UserError(f'{flags.step_dir}={checkpoint} is not a checkpoint step directory (one '
                      f'holding state/ and config/, e.g. WORKDIR/checkpoints/1600): pass such a '
                      f'path, or {flags.step_hint()}')
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
                    f'vit_jax.main --workdir={workdir} ...) or pass another {flags.workdir}')
  if checkpoint is None:
    healthy = [s for s in steps if s not in passed]
    if not healthy:
      raise UserError(f'every checkpoint in {root / "checkpoints"} is damaged or unverified '
                      f'(steps {", ".join(map(str, steps))}): pass another {flags.workdir}')
    return root / 'checkpoints' / str(healthy[-1])
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


def evals_entries(workdir: str, step: Optional[str]) -> Optional[Set[str]]:
  """The names of the `config.evals` entries that the stored configs of the run's steps (of
  `step` only, when given) hold; None when a step's config cannot be read as JSON (the command's
  own load then says what is wrong)."""
  root = epath.Path(workdir) / 'checkpoints'
  names = set()
  for each in ([int(step)] if step is not None else available_steps(workdir)):
    try:
      stored = json.loads((root / str(each) / 'config' / 'metadata').read_text())
      names |= set(stored.get('evals') or {})
    except (OSError, ValueError, AttributeError, TypeError):
      return None
  return names


__all__ = ['COMMANDS', 'INIT', 'Flags', 'available_steps', 'evals_entries', 'resolve_checkpoint']
