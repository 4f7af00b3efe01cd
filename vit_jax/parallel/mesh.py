"""Device mesh and the JAX distributed runtime."""

import jax
import numpy as np

from vit_jax.errors import UserError

AXES = ('data',)


def init_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None) -> None:
  """Starts the JAX distributed runtime when more than one process takes part; else a no-op."""
  if num_processes is None or num_processes <= 1:
    return
  if coordinator_address is None or process_id is None:
    raise UserError('--num_processes > 1 needs --coordinator_address=HOST:PORT and --process_id')
  # CPU processes talk through gloo (only CPU collectives use this; TPUs and GPUs ignore it).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def make_mesh(mesh_config) -> jax.sharding.Mesh:
  """Builds the device mesh; `mesh_config.data` = -1 takes every device."""
  n = jax.device_count()
  size = mesh_config.data
  if size == -1:
    size = n
  if size != n:
    raise UserError(f'config.mesh.data={mesh_config.data} but there are {n} devices: '
                    f'use --config.mesh.data=-1 (all devices) or {n}')
  devices = np.asarray(jax.devices()).reshape((size,))
  return jax.sharding.Mesh(devices, AXES)
