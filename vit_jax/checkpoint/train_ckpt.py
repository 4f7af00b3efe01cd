"""orbax training checkpoints: the train state plus the config that produced it.

Layout: `<workdir>/checkpoints/<step>/{state,config}`. The data position and the RNG are functions
of the step (the input pipeline is position-deterministic and the step RNG is fold_in(seed, step)),
so restoring the state restores them too.
"""

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every` steps and at the end, keeps the newest `keep`, restores sharded."""

  def __init__(self, workdir: str, *, keep: int):
    _use_plain_array_writes_on_cpu()
    directory = os.path.join(workdir, 'checkpoints')
    self.directory = directory if '://' in directory else os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=('state', 'config'))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state, config_dict: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config_dict)))

  def restore(self, step: int, abstract_state):
    """Restores onto the shardings carried by `abstract_state` (ShapeDtypeStructs)."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), config=ocp.args.JsonRestore()))
    return restored.state, restored.config

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


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
