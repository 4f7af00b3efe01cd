"""orbax training checkpoints: the train state plus the config that produced it.

Layout: `<workdir>/checkpoints/<step>/{state,config,facts}` (facts: the class count and input
shape the run had, `{'num_classes', 'image_shape'}`; absent in checkpoints of older versions).
The data position and the RNG are functions of the step (the input pipeline is
position-deterministic and the step RNG is fold_in(seed, step)), so restoring the state restores
them too. The state is stored in the run's encoder layout (stacked when `model.scan`); a run
resumes from a checkpoint of either layout (`in_stored_layout`), and its shapes are compared in
the stored layout (`shape_changes`), so a change of `model.scan` alone is not a change of shapes.

Crash safety: orbax writes each step into a temporary directory and renames it when complete, so
a process killed mid-write leaves only a temporary directory, which is ignored (and cleaned up on
the next start). A finished step that cannot be read back (disk damage, a truncated copy) is
reported, moved to `<workdir>/corrupt_checkpoints/<step>` (kept, not deleted) and the previous
step is used. Only a checkpoint that cannot be read is set aside: before its arrays are read,
`restore_latest` reads its config, facts and array shapes (`inspect`) and lets the caller refuse
a run that does not match (another config, other shapes), which leaves every checkpoint where it
is. A failed write (disk full, permissions) is one UserError line; the checkpoints already
written stay as they are.
"""

import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.models import layout
from vit_jax.parallel import sharding


@dataclasses.dataclass(frozen=True)
class Stored:
  """What a checkpoint says about the run that wrote it, read without reading its arrays."""
  step: int
  config: dict
  facts: Optional[dict]                 # None in checkpoints of older versions
  tree: Any                             # orbax's metadata tree of the state (shapes, dtypes)

  @property
  def shapes(self) -> Dict[str, Tuple[int, ...]]:
    """leaf path ('params/head/kernel') -> shape, in the stored layout."""
    return _shapes(self.tree)


class Checkpointer:
  """Saves train states with their config, keeps the newest `keep`, restores sharded."""

  def __init__(self, workdir: str, *, keep: int):
    _use_plain_array_writes_on_cpu()
    directory = os.path.join(workdir, 'checkpoints')
    self.directory = directory if is_remote(directory) else os.path.abspath(directory)
    self.workdir = workdir
    self._keep = keep
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True,
                                           cleanup_tmp_directories=True)
    return ocp.CheckpointManager(self.directory, options=options,
                                 item_names=('state', 'config', 'facts'))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, config_dict: dict, facts: Optional[dict] = None) -> None:
    items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config_dict))
    if facts is not None:
      items['facts'] = ocp.args.JsonSave(facts)
    try:
      self._manager.save(step, args=ocp.args.Composite(**items))
    except OSError as e:  # this save, or an earlier one still finishing in the background
      self._write_failed(e)

  def _write_failed(self, error: OSError) -> None:
    self._manager = self._open()  # forget the failed save; list what is really on disk
    raise UserError(f'cannot write a checkpoint to {self.directory} ({error.strerror or error}): '
                    f'free space or fix permissions there, then rerun the same command to resume '
                    f'from {self.resume_point()}') from None

  def resume_point(self) -> str:
    """'the checkpoint of step N' (the newest complete one on disk) or 'the start'."""
    manager = self._open()
    try:
      kept = sorted(manager.all_steps())
    finally:
      manager.close()
    return f'the checkpoint of step {kept[-1]}' if kept else 'the start'

  def read_config(self, step: int) -> dict:
    restored = self._manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))
    return dict(restored.config)

  def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
    """Restores onto the shardings carried by `abstract_state` (ShapeDtypeStructs); a checkpoint
    in the other encoder layout (written with the other `model.scan`) is converted."""
    target, convert = in_stored_layout(abstract_state, self.stored_tree(step))
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), config=ocp.args.JsonRestore()))
    return convert(restored.state), dict(restored.config)

  def stored_tree(self, step: int):
    """The tree structure (orbax metadata leaves) of the state stored at `step`; a ValueError
    when orbax cannot read it (it only logs an unreadable metadata file)."""
    path = epath.Path(self.directory) / str(step) / 'state'
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
      tree = checkpointer.metadata(path).item_metadata.tree
    if not jax.tree_util.tree_leaves(tree):
      raise ValueError(f'no array metadata in {path}')
    return tree

  def inspect(self, step: int) -> Stored:
    """The config, facts and array shapes of checkpoint `step` (its arrays are not read)."""
    step_dir = epath.Path(self.directory) / str(step)
    facts = None
    if (step_dir / 'facts').exists():
      facts = dict(self._manager.restore(step, args=ocp.args.Composite(
          facts=ocp.args.JsonRestore())).facts)
    return Stored(step=step, config=self.read_config(step), facts=facts,
                  tree=self.stored_tree(step))

  def restore_latest(self, abstract_state, check: Optional[Callable[[Stored], None]] = None
                     ) -> Tuple[Optional[int], Any, Optional[dict]]:
    """(step, state, config) of the newest readable checkpoint, or (None, None, None).

    `check(stored)` sees each candidate before its arrays are read, and raises to refuse it
    (nothing is moved). Unreadable steps are reported on stderr and moved aside; the next older
    one is tried.
    """
    while True:
      step = self.latest_step()
      if step is None:
        return None, None, None
      try:
        stored = self.inspect(step)
      except Exception as e:  # pylint: disable=broad-except  # whatever a damaged file raises
        self._set_aside(step, e)
        continue
      if check is not None:
        check(stored)
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


def in_stored_layout(abstract_state, stored_tree):
  """(restore target, convert): when the stored tree's encoder layout (unrolled encoderblock_{i}
  or stacked encoderblock, vit_jax/models/layout.py) differs from `abstract_state`'s, the target
  is `abstract_state` in the stored layout and `convert` turns the restored state into this
  run's layout and shardings (optimizer state too); otherwise both are as they are."""
  stacked = layout.is_stacked(abstract_state)
  if layout.is_stacked(stored_tree) == stacked:
    return abstract_state, lambda state: state
  shardings = jax.tree.map(lambda x: x.sharding, abstract_state)
  convert = jax.jit(functools.partial(layout.to_layout, stacked=stacked), out_shardings=shardings)
  return layout.to_layout(abstract_state, not stacked), convert


def _shapes(tree) -> Dict[str, Tuple[int, ...]]:
  return {sharding.path_string(path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def shape_changes(stored: Stored, abstract_state) -> List[Tuple[str, Any, Any]]:
  """(leaf, stored shape, this run's shape) for every array whose shape differs, or that only
  one of the two has (None on the side without it); [] when a restore fits. This run's state is
  taken in the stored encoder layout first: another `model.scan` alone changes no shape."""
  have = stored.shapes
  wanted = _shapes(in_stored_layout(abstract_state, stored.tree)[0])
  return [(name, have.get(name), wanted.get(name)) for name in sorted(set(have) | set(wanted))
          if have.get(name) != wanted.get(name)]


def abstract_with_shardings(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
