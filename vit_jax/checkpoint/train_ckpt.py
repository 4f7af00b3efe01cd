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
the next start). Its `manifest.json` (each file's size and checksum, `integrity.py`) is written
inside that commit, before the rename (`_commit_with_manifest`), and every restore checks the
files against it (the array data's checksums on a thread while the arrays are read). A step whose
own files fail that check (disk damage, a truncated copy, a flipped bit, no manifest) is set aside (moved to
`<workdir>/corrupt_checkpoints/<step>-<time>`, kept, not deleted), whether or not orbax could read
it, and the previous step is used; any other failure (out of memory, disk, permissions, I/O)
stops the run with one UserError line and leaves every checkpoint in place. Before its arrays are read, `restore_latest` reads a step's config, facts
and array shapes (`inspect`) and lets the caller refuse a run that does not match (another
config, other shapes, other data), which also leaves every checkpoint where it is. A failed write
(disk full, permissions) is one UserError line; the half-written temporary directory is removed
and the checkpoints already written stay as they are.
"""

import asyncio
import dataclasses
import errno
import functools
import os
import re
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.checkpoint import integrity
from vit_jax import errors
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
    # A run refused at start-up (config.init of another model) leaves no empty folder behind.
    self._created = not is_remote(directory) and not os.path.exists(self.directory)
    self._manager = self._open()

  def _open(self) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self._keep, create=True, cleanup_tmp_directories=True,
        temporary_path_class=_commit_with_manifest(self.directory))
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
    self.wait()  # the previous save (orbax waits for it anyway): its failure said first
    try:
      self._manager.save(step, args=ocp.args.Composite(**items))
    except Exception as e:  # pylint: disable=broad-except
      self._failed_write(e)

  def _failed_write(self, error: Exception) -> None:
    """A write that failed for want of space or permission (orbax and tensorstore raise OSError,
    ValueError or tensorstore's own errors, with the errno or a status in the text) is one
    line; anything else is a bug and keeps its traceback."""
    reason = write_failure_reason(error)
    if reason is None:
      raise error
    self._remove_temporary_directories()
    self._manager = self._open()  # forget the failed save; list what is really on disk
    raise UserError(f'cannot write a checkpoint to {self.directory} ({reason}): free space or fix '
                    f'permissions there, then rerun the same command to resume from '
                    f'{self.resume_point()}') from None

  def _remove_temporary_directories(self) -> None:
    """The half-written step directories of a failed save (orbax's `*.orbax-checkpoint-tmp*`)."""
    if jax.process_index() != 0 or not os.path.isdir(self.directory):
      return
    for name in os.listdir(self.directory):
      if 'orbax-checkpoint-tmp' in name:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

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
    """(step, state, config) of the newest healthy checkpoint, or (None, None, None).

    Each candidate's files are checked against its manifest (`integrity`) as it is restored:
    sizes and small files before anything is read, the checksums of the array data on a thread
    while the arrays are read. A step whose files are damaged is set aside (moved, with a line
    saying so) and the next older one is tried, whether or not orbax could read it.
    `check(stored)` sees each candidate before its arrays are read, and raises to refuse it
    (nothing is moved). A restore that fails while the files are intact is one UserError line
    and nothing is moved. Checkpoints newer than the one used that sit in
    `corrupt_checkpoints/` are named in a note.
    """
    while True:
      step = self.latest_step()
      if step is None:
        self._note_set_aside_newer(None)
        return None, None, None
      restored = self._restore_verified(step, abstract_state, check)
      if restored is not None:
        self._note_set_aside_newer(step)
        return (step, *restored)

  def _restore_verified(self, step: int, abstract_state, check) -> Optional[Tuple[Any, dict]]:
    """(state, config) of checkpoint `step` once its files are verified, or None when it was
    set aside as damaged."""
    step_dir = epath.Path(self.directory) / str(step)
    try:
      damaged = integrity.damage(step_dir, large=False)  # before anything is read
    except Exception as e:  # pylint: disable=broad-except  # I/O: the restore's error line
      self._unreadable(step, e)
      return None
    if damaged:
      self._set_aside(step, damaged)
      return None
    verification = integrity.Verification(step_dir)  # the array data, beside the restore
    try:
      try:
        stored = self.inspect(step)
      except Exception as e:  # pylint: disable=broad-except  # whatever reading it raised
        self._unreadable(step, e, verification)
        return None
      if check is not None:
        check(stored)
      try:
        state, config = self.restore(step, abstract_state)
      except Exception as e:  # pylint: disable=broad-except  # whatever reading it raised
        self._unreadable(step, e, verification)
        return None
      try:
        damaged = verification.result()
      except Exception as e:  # pylint: disable=broad-except  # I/O, memory: not the files
        _delete(state)
        raise UserError(f'cannot check the files of checkpoint {step} in {self.directory} '
                        f'({_reason(e)}); it stays where it is: {restore_failure_fix(e)}, then '
                        f'rerun the same command') from None
      if damaged:
        _delete(state)  # read, but not what was written: never used
        self._set_aside(step, damaged)
        return None
      return state, config
    finally:
      verification.cancel()  # (finished by now, unless the step was refused or failed)

  def _unreadable(self, step: int, error: Exception,
                  verification: Optional[integrity.Verification] = None) -> None:
    """Sets step `step` aside if its own files are damaged; otherwise a UserError naming the
    failure, every checkpoint left in place."""
    step_dir = epath.Path(self.directory) / str(step)
    failure = _failure(error)
    try:
      if verification is None:
        damaged = integrity.damage(step_dir)
      else:  # the large files' checksums: the verification's
        damaged = integrity.damage(step_dir, large=False) or verification.result()
    except Exception as e:  # pylint: disable=broad-except  # I/O, memory: says nothing of the files
      damaged = None
      failure = f'{failure}; checking its files: {_reason(e)}'
    if damaged is None:
      raise UserError(f'cannot read checkpoint {step} in {self.directory} ({failure}); its files '
                      f'pass the integrity check, so it stays where it is: '
                      f'{restore_failure_fix(error)}, then rerun the same command') from None
    self._set_aside(step, f'{damaged}; {failure}')

  def _set_aside(self, step: int, reason: str) -> None:
    source = epath.Path(self.directory) / str(step)
    target = epath.Path(self.workdir) / CORRUPT_DIR / f'{step}-{int(time.time())}'
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      source.rename(target)
      state = 'cannot be verified' if reason == integrity.UNVERIFIED else 'is damaged'
      print(f'checkpoint {step} in {self.directory} {state} ({reason[:240]}); moved it to '
            f'{target} and trying the previous one', file=sys.stderr, flush=True)
    _sync(f'set_aside_{step}')
    self._manager.close()
    self._manager = self._open()

  def _note_set_aside_newer(self, step: Optional[int]) -> None:
    newer = set_aside_after(self.workdir, step or 0)
    if newer and jax.process_index() == 0:
      start = f'from step {step}' if step else 'from the start'
      print(f'note: starting {start} while the newer checkpoint(s) '
            f'{", ".join(str(s) for s, _ in newer)} sit in '
            f'{os.path.join(self.workdir, CORRUPT_DIR)} (set aside as damaged); the steps after '
            f'{step or 0} are trained again', file=sys.stderr, flush=True)

  def wait(self) -> None:
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  # an async write failed after `save`
      self._failed_write(e)

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()
      if self._created and jax.process_index() == 0:
        try:
          os.rmdir(self.directory)  # only while empty: nothing was saved
        except OSError:
          pass


CORRUPT_DIR = 'corrupt_checkpoints'


def _commit_with_manifest(directory: str):
  """orbax's commit for `directory` (a rename of the temporary step directory; a commit file on
  GCS) with the step's manifest written first, on process 0 where orbax commits: no step is
  ever complete without its manifest, even when the run is killed right after."""
  base = ocp.path.atomicity_defaults.get_default_temporary_path_class(epath.Path(directory))

  class WithManifest(base):

    async def finalize(self, *args, **kwargs):
      if self.get_final().name.isdigit():  # the step, not one of its items (state/, config/)
        await asyncio.to_thread(integrity.write_manifest, self.get())
      await super().finalize(*args, **kwargs)

  return WithManifest


def set_aside_after(workdir: str, step: int) -> List[Tuple[int, str]]:
  """(step, directory name) of the checkpoints in `<workdir>/corrupt_checkpoints` newer than
  `step`, oldest first."""
  directory = epath.Path(workdir) / CORRUPT_DIR
  if not directory.is_dir():
    return []
  found = []
  for path in directory.iterdir():
    head = path.name.split('-')[0]
    if head.isdigit() and int(head) > step:
      found.append((int(head), path.name))
  return sorted(found)


def _delete(state) -> None:
  """Frees the device memory of a restored state that is not used."""
  for leaf in jax.tree_util.tree_leaves(state):
    if isinstance(leaf, jax.Array):
      leaf.delete()


def _failure(error: BaseException) -> str:
  """'Type: message' of a failed read: of the error in its chain that says it ran out of memory
  (orbax wraps tensorstore's and XLA's), else of the error itself."""
  described = [f'{type(e).__name__}: {_one_line(e)}' for e in errors.chain(error)]
  memory = [d for d in described if any(w in d for w in errors.OUT_OF_MEMORY_WORDS)]
  return (memory or described)[0]


def _reason(error: BaseException) -> str:
  return getattr(error, 'strerror', None) or _one_line(error) or type(error).__name__


# orbax's wrapper of a tensorstore error ends with the repr of a bound method, not its text.
_TENSORSTORE_DETAILS = re.compile(r'\.? See full TensorStore details: <bound method .*$')


def _one_line(error: BaseException) -> str:
  text = _TENSORSTORE_DETAILS.sub('', ' '.join(str(error).split()))
  return text[:200] or type(error).__name__


def write_failure_reason(error: BaseException) -> Optional[str]:
  """The reason of a write that failed for want of space or permission ('No space left on
  device'), or None for any other failure. tensorstore reports a full disk as RESOURCE_EXHAUSTED
  without an errno."""
  code = errors.environment_errno(error)
  if code in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS):
    return os.strerror(code)
  if any('RESOURCE_EXHAUSTED' in str(e) for e in errors.chain(error)):
    return os.strerror(errno.ENOSPC)
  return None


def restore_failure_fix(error: BaseException) -> str:
  """What to do about a restore that failed for a reason outside the checkpoint's files."""
  if errors.out_of_memory(error):
    return f'{errors.MEMORY_FIX} for the restore'
  code = errors.environment_errno(error)
  if code in (errno.ENOSPC, errno.EDQUOT):
    return 'free space on the disk'
  if code in (errno.EACCES, errno.EPERM, errno.EROFS):
    return 'make the checkpoint readable (and its workdir writable) for this user'
  if code is not None or any(isinstance(e, OSError) for e in errors.chain(error)):
    return 'fix the disk or file system it is on'
  return ('fix the cause named here (if the checkpoint itself is damaged, move it to '
          f'{CORRUPT_DIR}/ to resume from the previous one)')


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


_PLAIN_WRITES = []


def _use_plain_array_writes_on_cpu() -> None:
  """Replica-parallel writes slice every replicated array with a fresh jit (one compile per
  shape) and buy nothing without accelerators."""
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
