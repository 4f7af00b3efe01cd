"""The sharding policy: where parameters, optimizer state and batches live on the mesh.

One file, so a new strategy is a change here and nowhere else. Today: parameters and optimizer
state are replicated on every device and batches are split over the 'data' axis (data parallel).
"""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.errors import UserError


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_shardings(abstract_tree, mesh):
  """Shardings for a tree of parameters or optimizer state (same structure as the input)."""
  return jax.tree.map(lambda _: replicated(mesh), abstract_tree)


def batch_sharding(mesh) -> NamedSharding:
  """Leading (example) axis split over 'data'; the rest replicated."""
  return NamedSharding(mesh, P('data'))


def check_batch(global_batch: int, mesh, what: str = 'batch_size', flag: str = 'batch_size'):
  """Raises a UserError unless the global batch splits evenly over processes and devices."""
  devices = mesh.devices.size
  if global_batch % devices or global_batch % jax.process_count():
    raise UserError(f'{what}={global_batch} does not split over {devices} devices in '
                    f'{jax.process_count()} processes: use a multiple of {devices}, e.g. '
                    f'--config.{flag}={max(devices, global_batch // devices * devices)}')


def shard_batch(local_batch: dict, mesh) -> dict:
  """Host-local numpy batch (this process's rows) -> global jax.Array split over 'data'."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)
