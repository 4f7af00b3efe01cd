"""Devices: mesh construction, the sharding policy, and the distributed runtime."""

from vit_jax.parallel.mesh import (check_agreement, describe_run, init_distributed, make_mesh,
                                   run_record)
from vit_jax.parallel.sharding import batch_sharding, param_shardings, replicated, shard_batch

__all__ = ['check_agreement', 'describe_run', 'init_distributed', 'make_mesh', 'run_record',
           'batch_sharding', 'param_shardings', 'replicated', 'shard_batch']
