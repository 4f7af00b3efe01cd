"""Devices: mesh construction, the sharding policy, and the distributed runtime."""

from vit_jax.parallel.mesh import describe_run, init_distributed, make_mesh
from vit_jax.parallel.sharding import batch_sharding, param_shardings, replicated, shard_batch

__all__ = ['describe_run', 'init_distributed', 'make_mesh', 'batch_sharding', 'param_shardings', 'replicated',
           'shard_batch']
