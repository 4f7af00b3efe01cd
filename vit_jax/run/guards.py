"""What keeps a run safe: preemption signals, non-finite numbers, and config drift on resume.

  Preemption         SIGTERM, SIGHUP (a closed terminal or SSH connection) or SIGINT sets a flag;
                     the loop finishes the current step, saves a checkpoint (with the train
                     metrics of the steps since the last record) and exits 0. A SIGINT before
                     the first step (`begin_training`) stops the run at once, nothing trained. With several
                     processes, JAX's preemption sync point makes every process stop at the
                     same step (SIGINT and SIGHUP are turned into the SIGTERM that JAX's
                     preemption notifier listens for). A second SIGINT on a single process stops
                     at once (KeyboardInterrupt), except while a checkpoint is written
                     (`saving()`) or once the stop step is reached: that checkpoint is finished
                     first.
  check_finite       one step's `nonfinite` flag -> an error naming the step and the metric.
  config_changes     keys whose values differ between the stored config and this run's config,
                     except the operational ones that do not change the training computation.
  stop_with_parent   in a run started by a sweep ($VIT_JAX_STOP_WITH_PARENT), the sweep's death
                     (even by kill -9) is a SIGTERM to the run: it saves and stops, no orphan.
  refuse_mismatch    resuming a checkpoint of another config or on changed data (unless
                     allowed), or one whose arrays have other shapes than this run's (never
                     allowed: another model, class count or input shape), is one line naming
                     the cause; the checkpoints stay as they are. So is a checkpoint of an
                     earlier state of vit_jax (`checkpoint.versions.refuse_earlier`).
"""

import contextlib
import math
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from vit_jax import interrupt
from vit_jax.checkpoint import versions
from vit_jax.errors import UserError

# Keys that may differ on resume: they change logging, I/O or device layout, not the math.
OPERATIONAL_KEYS = frozenset({
    'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints', 'progress', 'data_dir',
    'prefetch', 'cache', 'eval_batch_size', 'compile_only', 'compile_for', 'parallelism',
    'mesh.data', 'mesh.fsdp', 'mesh.model', 'model.scan', 'init', 'init_posemb_resize',
    'model.attention',  # the attention kernel: same parameters, same math
})
# Key prefixes that may differ on resume: the evaluators (what is measured, not what is trained).
OPERATIONAL_PREFIXES = ('evals.',)


class Diverged(UserError):
  """A NaN/Inf loss or gradient norm (one line: the step, the metric, the way out)."""


class Preemption:
  """Turns SIGTERM/SIGHUP/SIGINT into a request to save and stop at a step boundary."""

  def __init__(self):
    self._requested = False
    self._saving = False
    self._stopping = False  # the stop step is reached: the run saves, closes and returns
    self._training = False  # until the first step: a Ctrl-C stops the run at once
    self._interrupted = False
    self._calls = 0  # should_stop calls (JAX's preemption sync point counts them)
    self._previous = {}
    import jax  # pylint: disable=g-import-not-at-top  # a sweep uses PARENT_ENV without JAX
    self._multiprocess = jax.process_count() > 1

  def __enter__(self):
    interrupt.check()  # a Ctrl-C during start-up that Python swallowed: stop before training
    if threading.current_thread() is not threading.main_thread():
      return self  # Python delivers signals to the main thread only: nothing to listen for
    signals = [signal.SIGINT, signal.SIGHUP]  # SIGHUP: the terminal or SSH connection closed
    if not self._multiprocess:  # with several processes, JAX's notifier owns SIGTERM
      signals.append(signal.SIGTERM)
    for sig in signals:
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
    if signum == signal.SIGINT and not self._training:  # still starting: stop, train nothing
      self._interrupted = True
      raise KeyboardInterrupt
    if self._requested and signum == signal.SIGINT:
      if self._saving:
        print('\nstill writing a checkpoint: the run stops once it is complete', file=sys.stderr,
              flush=True)
      if self._saving or self._stopping:
        return
      raise KeyboardInterrupt
    self._requested = True

  def begin_training(self) -> None:
    """From here a Ctrl-C saves and stops at a step boundary; one that came before (even if the
    code it interrupted swallowed the KeyboardInterrupt) stops the run now."""
    if self._interrupted:
      raise KeyboardInterrupt
    self._training = True

  @contextlib.contextmanager
  def saving(self):
    """While a checkpoint is written, a second Ctrl-C does not interrupt it (after the stop step
    none does: the run only saves, closes its files and returns)."""
    self._saving = True
    try:
      yield
    finally:
      self._saving = False

  @property
  def requested(self) -> bool:
    return self._requested

  def should_stop(self, step: int) -> bool:
    """True at the step where this run (every process of it) saves and stops; called once per
    step, from the first step this process trains."""
    if self._multiprocess:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      # JAX agrees on the stop as the highest count passed so far + 1, counting 0 before the
      # first call: the count of calls (1, 2, ... on every process alike), not the step, so that
      # a signal before the first step of a resumed run stops it at that step.
      self._calls += 1
      self._requested = multihost_utils.reached_preemption_sync_point(self._calls)
    self._stopping = self._requested
    return self._requested


PARENT_ENV = 'VIT_JAX_STOP_WITH_PARENT'  # the launcher's PID, set by the launcher
_PR_SET_PDEATHSIG = 1


def stop_with_parent(poll_s: float = 1.0) -> None:
  """If $VIT_JAX_STOP_WITH_PARENT names this process's parent, arranges a SIGTERM to this process
  when the parent dies: on Linux through the kernel (PR_SET_PDEATHSIG), elsewhere by a thread
  that watches the parent PID. A parent that is already gone gives the SIGTERM at once."""
  value = os.environ.get(PARENT_ENV)
  if not value or not value.isdigit():
    return
  parent = int(value)
  armed = False
  if sys.platform.startswith('linux'):
    import ctypes  # pylint: disable=g-import-not-at-top
    try:
      armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) == 0
    except (OSError, AttributeError):
      armed = False
  if not armed:
    def watch():
      while os.getppid() == parent:
        time.sleep(poll_s)
      os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name='parent_watch', daemon=True).start()
  elif os.getppid() != parent:  # the parent died before the death signal was armed
    os.kill(os.getpid(), signal.SIGTERM)


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
    fix = 'raise config.max_nonfinite_steps, or lower config.lr'
  else:
    why = f'at step {step}'
    fix = ('lower config.lr, lengthen config.warmup_steps, or skip such steps with '
           'config.max_nonfinite_steps=K')
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
    if key in OPERATIONAL_KEYS or key.startswith(OPERATIONAL_PREFIXES):
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
    raise UserError(f'{workdir} holds a run (step {step}) with another config: {_listed(changes)}; '
                    f'rerun with the same config, use a new --workdir, or pass '
                    f'--allow_config_change to continue with the new values')


def _listed(changes, limit: int = 8) -> str:
  text = ', '.join(f'{k} {a!r} -> {b!r}' for k, a, b in changes[:limit])
  return text + (f' (and {len(changes) - limit} more)' if len(changes) > limit else '')


def _shapes(changes, limit: int = 3) -> str:
  """The differing arrays, parameters first: 'params/head/kernel (32, 10) -> (32, 11), ...'."""
  ordered = sorted(changes, key=lambda c: (not c[0].startswith('params/'), c[0]))
  text = ', '.join(f'{name} {_shape(a)} -> {_shape(b)}' for name, a, b in ordered[:limit])
  return text + (f' (and {len(changes) - limit} more)' if len(changes) > limit else '')


def _shape(shape) -> str:
  return 'absent' if shape is None else str(tuple(shape))


def refuse_mismatch(workdir: str, step: int, *, stored_config: dict, config: dict,
                    stored_facts: Optional[dict], facts: dict, shape_changes: list,
                    allow_config_change: bool, data_changes: Sequence[str] = ()) -> List[str]:
  """Raises UserError if checkpoint `step` must not be resumed by this run (module docstring);
  returns the notes to print when it may (changed data, allowed by `allow_config_change`).

  `shape_changes`: (array, stored shape, this run's shape) triples (`train_ckpt.shape_changes`);
  `data_changes`: what changed in the dataset since the checkpoint, in words
  (`vit_jax.data.identity.changes`).
  """
  versions.refuse_earlier(stored_config, f'{workdir} (step {step})')
  changes = config_changes(stored_config, config)
  fresh = (f'use a new --workdir (config.init={workdir} starts a new run from its weights '
           'where they fit)')
  dataset = config.get('dataset')
  data_text = '; '.join(data_changes)
  if changes and not data_changes and not allow_config_change and not shape_changes:
    refuse_config_drift(workdir, step, stored_config, config)
  if not shape_changes:
    if not data_changes:
      return []
    if not allow_config_change:
      other_config = f'with another config ({_listed(changes)}) and ' if changes else ''
      raise UserError(f'{workdir} holds a run (step {step}) {other_config}trained on other data '
                      f'({dataset}: {data_text}): restore the dataset as it was to resume, use a '
                      f'new --workdir, or pass --allow_config_change to continue on the data as '
                      f'it is now')
    return [f'note: --allow_config_change: continuing the run of {workdir} (step {step}) on '
            f'changed data ({dataset}: {data_text})']
  arrays = f'its arrays have other shapes ({_shapes(shape_changes)})'
  data = [(k, (stored_facts or {}).get(k), v) for k, v in facts.items()
          if k in _SHAPE_FACTS and stored_facts and k in stored_facts
          and _plain(stored_facts[k]) != _plain(v)]
  if data and (data_changes or not changes):  # the data changed the shapes (a class added
    # changes the head), whatever else changed in the config
    cause = f'; {data_text}' if data_text else ''
    raise UserError(f'{workdir} holds a run (step {step}) of this config on other data '
                    f'({dataset}: {_listed(data)}), so {arrays}{cause}: restore the dataset as '
                    f'it was to resume, or {fresh}')
  if changes and not allow_config_change:
    raise UserError(f'{workdir} holds a run (step {step}) with another config: '
                    f'{_listed(changes)}; {arrays}, so it cannot go on with this config: rerun '
                    f'with the same config, or {fresh}')
  if changes:
    raise UserError(f'--allow_config_change cannot continue {workdir} (step {step}) with '
                    f'{_listed(changes)}: {arrays}; rerun with the stored values of the keys '
                    f'that change them, or {fresh}')
  raise UserError(f'{workdir} holds a run (step {step}) of this config on other data, so '
                  f'{arrays}: restore the dataset as it was to resume, or {fresh}')


# The facts that set array shapes (the head's width, the input's).
_SHAPE_FACTS = ('num_classes', 'image_shape')


def _plain(value):
  return tuple(value) if isinstance(value, list) else value


__all__ = ['Preemption', 'Diverged', 'check_finite', 'config_changes',
           'refuse_config_drift', 'refuse_mismatch', 'stop_with_parent', 'PARENT_ENV',
           'OPERATIONAL_KEYS']
