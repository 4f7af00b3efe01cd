"""What keeps a run safe: preemption signals, non-finite numbers, and config drift on resume.

  Preemption         SIGTERM or SIGINT sets a flag; the loop finishes the current step, saves a
                     checkpoint and exits 0. With several processes, JAX's preemption sync point
                     makes every process stop at the same step (a SIGINT is turned into the
                     SIGTERM that JAX's preemption notifier listens for). A second SIGINT on a
                     single process stops at once (KeyboardInterrupt).
  check_finite       one step's `nonfinite` flag -> an error naming the step and the metric.
  config_changes     keys whose values differ between the stored config and this run's config,
                     except the operational ones that do not change the training computation.
"""

import math
import os
import signal
import threading
from typing import Dict, Iterable, List, Optional, Tuple

import jax

from vit_jax.errors import UserError

# Keys that may differ on resume: they change logging, I/O or device layout, not the math.
OPERATIONAL_KEYS = frozenset({
    'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints', 'progress', 'data_dir',
    'prefetch', 'cache', 'eval_batch_size', 'compile_only', 'parallelism', 'mesh.data',
    'mesh.fsdp', 'mesh.model', 'init', 'init_posemb_resize', 'fewshot.every',
    'fewshot.dataset', 'fewshot.train_split', 'fewshot.eval_split', 'fewshot.shots',
    'fewshot.l2_reg', 'real.dataset', 'real.split',
})


class Diverged(UserError):
  """A NaN/Inf loss or gradient norm (one line: the step, the metric, the way out)."""


class Preemption:
  """Turns SIGTERM/SIGINT into a request to save and stop at a step boundary."""

  def __init__(self):
    self._requested = False
    self._previous = {}
    self._multiprocess = jax.process_count() > 1

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      return self  # Python delivers signals to the main thread only: nothing to listen for
    signals = [signal.SIGINT] if self._multiprocess else [signal.SIGTERM, signal.SIGINT]
    for sig in signals:  # with several processes, JAX's notifier owns SIGTERM
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self._multiprocess:
      os.kill(os.getpid(), signal.SIGTERM)  # let JAX's preemption notifier see it
      return
    if self._requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self._requested = True

  @property
  def requested(self) -> bool:
    return self._requested

  def should_stop(self, step: int) -> bool:
    """True at the step where this run (every process of it) saves and stops."""
    if self._multiprocess:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      self._requested = multihost_utils.reached_preemption_sync_point(int(step))
    return self._requested


def check_finite(step: int, metrics: Dict[str, float], last_checkpoint: Optional[int],
                 skipped: int = 0, max_skipped: int = 0) -> None:
  """Raises `Diverged` if step `step` was non-finite and no more skipping is allowed."""
  if not metrics.get('nonfinite'):
    return
  if max_skipped and skipped <= max_skipped:
    return
  bad = [f'{k} {v}' for k, v in sorted(metrics.items())
         if k in ('loss', 'grad_norm') and not math.isfinite(v)] or ['loss or grad_norm']
  kept = (f'the last checkpoint (step {last_checkpoint}) is intact' if last_checkpoint
          else 'no checkpoint was written')
  if max_skipped:
    why = f'after skipping {skipped - 1} such steps (the limit is {max_skipped})'
    fix = 'raise --config.max_nonfinite_steps, or lower --config.lr'
  else:
    why = f'at step {step}'
    fix = ('lower --config.lr, lengthen --config.warmup_steps, or skip such steps with '
           '--config.max_nonfinite_steps=K')
  raise Diverged(f'non-finite {", ".join(bad)} {why}; {kept}: {fix}')


def _flatten(tree: dict, prefix: str = '') -> Dict[str, object]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = value
  return out


def config_changes(stored: dict, current: dict) -> List[Tuple[str, object, object]]:
  """(key, stored value, current value) for every non-operational key present in both."""
  old, new = _flatten(stored), _flatten(current)
  changes = []
  for key in sorted(set(old) & set(new)):
    if key in OPERATIONAL_KEYS:
      continue
    a, b = old[key], new[key]
    if isinstance(a, list):
      a = tuple(a)
    if isinstance(b, list):
      b = tuple(b)
    if a != b:
      changes.append((key, old[key], new[key]))
  return changes


def refuse_config_drift(workdir: str, step: int, stored: dict, current: dict) -> None:
  changes = config_changes(stored, current)
  if changes:
    listed = ', '.join(f'{k} {a!r} -> {b!r}' for k, a, b in changes[:8])
    more = f' (and {len(changes) - 8} more)' if len(changes) > 8 else ''
    raise UserError(f'{workdir} holds a run (step {step}) with another config: {listed}{more}; '
                    f'rerun with the same config, use a new --workdir, or pass '
                    f'--allow_config_change to continue with the new values')


__all__ = ['Preemption', 'Diverged', 'check_finite', 'config_changes', 'refuse_config_drift',
           'OPERATIONAL_KEYS']
