"""orbax training checkpoints: the train state plus the config that produced it.

Layout: `<workdir>/checkpoints/<step>/{state,config}`. The data position and the RNG are functions
of the step (the input pipeline is position-deterministic and the step RNG is fold_in(seed, step)),
so restoring the state restores them too.

Crash safety: orbax writes each step into a temporary directory and renames it when complete, so
a process killed mid-write leaves only a temporary directory, which is ignored (and cleaned up on
the next start). A finished step that cannot be read back (disk damage, a truncated copy) is
reported, moved to `<workdir>/corrupt_checkpoints/<step>` (kept, not deleted) and the previous
step is used. A failed write (disk full, permissions) is one UserError line; the checkpoints
already written stay as they are.
"""

import os
import sys
import time
from typing import Any, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.errors import UserError


class Checkpointer:
  """Saves train states with their config, keeps the newest `keep`, restores sharded."""

  def __init__(self, workdir: str, *, keep: int):
    _use_plain_array_writes_on_cpu()
    directory = os.path.join(workdir, 'checkpoints')
    self.directory = directory if '://' in directory else os.path.abspath(directory)
    self.workdir = workdir
    self._keep = keep
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True,
                                           cleanup_tmp_directories=True)
    return ocp.CheckpointManager(self.directory, options=options,
                                 item_names=('state', 'config'))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, config_dict: dict) -> None:
    try:
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config_dict)))
    except OSError as e:  # this save, or an earlier one still finishing in the background
      self._write_failed(e)

  def _write_failed(self, error: OSError) -> None:
    self._manager = self._open()  # forget the failed save; list what is really on disk
    kept = self.all_steps()
    resume = f'the checkpoint of step {kept[-1]}' if kept else 'the start'
    raise UserError(f'cannot write a checkpoint to {self.directory} ({error.strerror or error}): '
                    f'free space or fix permissions there, then rerun the same command to resume '
                    f'from {resume}') from None

  def read_config(self, step: int) -> dict:
    restored = self._manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))
    return dict(restored.config)

  def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
    """Restores onto the shardings carried by `abstract_state` (ShapeDtypeStructs)."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), config=ocp.args.JsonRestore()))
    return restored.state, dict(restored.config)

  def restore_latest(self, abstract_state) -> Tuple[Optional[int], Any, Optional[dict]]:
    """(step, state, config) of the newest readable checkpoint, or (None, None, None).

    Unreadable steps are reported on stderr and moved aside; the next older one is tried.
    """
    while True:
      step = self.latest_step()
      if step is None:
        return None, None, None
      try:
        state, config = self.restore(step, abstract_state)
        return step, state, config
      except Exception as e:  # pylint: disable=broad-except  # whatever a damaged file raises
        self._set_aside(step, e)

  def _set_aside(self, step: int, error: BaseException) -> None:
    source = epath.Path(self.directory) / str(step)
    target = epath.Path(self.workdir) / 'corrupt_checkpoints' / f'{step}-{int(time.time())}'
    reason = ' '.join(str(error).split())[:160] or type(error).__name__
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      source.rename(target)
      print(f'checkpoint {step} in {self.directory} is unreadable ({type(error).__name__}: '
            f'{reason}); moved it to {target} and trying the previous one', file=sys.stderr,
            flush=True)
    _sync(f'set_aside_{step}')
    self._manager.close()
    self._manager = self._open()

  def wait(self) -> None:
    try:
      self._manager.wait_until_finished()
    except OSError as e:
      self._write_failed(e)

  def close(self) -> None:
    try:
      self._manager.wait_until_finished()
    except OSError as e:  # an async write failed after `save` returned
      self._write_failed(e)
    finally:
      self._manager.close()


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


_PLAIN_WRITES = []


def _use_plain_array_writes_on_cpu() -> None:
  """Replica-parallel writes slice every replicated array with a fresh jit (one compile per
  shape: ~10 s for a small ViT on 8 CPU devices) and buy nothing without accelerators."""
  if jax.default_backend() != 'cpu' or _PLAIN_WRITES:
    return
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)
  _PLAIN_WRITES.append(True)


def abstract_with_shardings(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
