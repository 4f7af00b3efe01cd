"""Running a cluster's command-line tools (gcloud, sbatch, squeue, scancel) for `launch`: a tool
that is missing or fails is one UserError line with its reason."""

import subprocess
from typing import List, Sequence

from vit_jax.errors import UserError


def reason(stderr: str, markers: Sequence[str], limit: int = 300) -> str:
  """The part of a tool's stderr that says why it failed: its lines holding one of `markers`
  (else its last lines), in one line, shortened at a word boundary (with ' ...') to about
  `limit` characters."""
  lines = [' '.join(line.split()) for line in stderr.splitlines() if line.strip()]
  errors = [line for line in lines if any(m in line for m in markers)]
  text = ' '.join(errors or lines[-3:]) or 'no message'
  if len(text) <= limit:
    return text
  return text[:limit].rsplit(' ', 1)[0] + ' ...'


def call(command: List[str], *, missing: str, markers: Sequence[str], shown: int = 6,
         capture: bool = False) -> str:
  """Runs `command` and returns its stdout (when `capture`; else its output goes to ours).
  UserError when it is not installed (`missing` says what to do) or exits non-zero (the first
  `shown` words of the command, its status and `reason`)."""
  try:
    result = subprocess.run(command, check=False, text=True,
                            stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.PIPE if capture else None)
  except FileNotFoundError:
    raise UserError(f'{command[0]} is not installed here: {missing}') from None
  if result.returncode:
    said = reason(result.stderr or '', markers) if capture else 'see its output above'
    words = ' '.join(command[:shown]) + (' ...' if len(command) > shown else '')
    raise UserError(f'{words} failed with exit status {result.returncode} ({said})')
  return result.stdout or ''

__all__ = ['call', 'reason']
