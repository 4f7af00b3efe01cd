"""Devices: mesh construction, the sharding policy, and the distributed runtime.

The names load their module on first use: `parallel.choices` is read by the config's validation
before JAX is imported.
"""

from vit_jax import lazy

# name -> the module that defines it
_HOMES = {'check_agreement': 'mesh', 'describe_run': 'mesh', 'init_distributed': 'mesh',
          'make_mesh': 'mesh', 'run_record': 'mesh',
          'batch_sharding': 'sharding', 'param_shardings': 'sharding', 'replicated': 'sharding',
          'shard_batch': 'sharding'}

__getattr__ = lazy.attributes(__name__, _HOMES)

__all__ = sorted(_HOMES)
