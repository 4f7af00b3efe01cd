"""The XLA flags the training commands set for themselves (one place), added to XLA_FLAGS before
JAX starts its backends. A flag the user already set in XLA_FLAGS (to either value) stays as it is.

- `--xla_cpu_enable_concurrency_optimized_scheduler=false`: XLA:CPU's default scheduler orders a
  program's operations so that independent ones can run at the same time, and keeps more
  temporaries alive for that. With the memory-minimising order instead, a train step needs a
  fifth to a quarter less memory for its temporaries (ViT-Ti/16 at batch 32 and 224 px: 1.55 GiB
  instead of 2.05; R50+ViT-B/16 at batch 8: 3.22 instead of 4.24), compiles about 10% faster, runs
  as fast or slightly faster, and a cold run reaches its first step sooner (fewer fresh pages to
  fault in); the losses are bitwise the same (AMD EPYC family 26 model 2; benchmarks/README.md,
  "The CPU scheduler"). Only the commands that train set it (`train`, and `bench --mode=train`
  for the step it times): ViT-Ti/16 inference at batch 32 and 224 px ran 4% slower with it (75.2 and
  90.0 img/s against 92.1 and 93.4 in a later check, `bench --mode=infer`, AMD EPYC family 26
  model 2; benchmarks/README.md), so predict, export,
  analyze and `bench --mode=infer` keep XLA's default. The CPU backend's flag: other backends
  ignore it.
  A config chooses with `xla_cpu_schedule`: 'memory', 'concurrency' (XLA's own order) or 'auto',
  the default: 'memory' when one activation of the step (a micro-batch on one device times the
  transformer's tokens x width, or a ResNet's first feature map) holds at least `AUTO_MEMORY_FROM`
  values, else 'concurrency'. Where every operation is small, running independent ones together
  wins and memory does not matter. Train steps of ViT-Ti/16 at batch 32 (`bench --mode=train`,
  img/s with XLA's order / the memory-minimising one, two alternated rounds, AMD EPYC family 26
  model 2): 64 px (104 k values) 339 / 311 and 344 / 309; 112 px (307 k) 150 / 139 and 148 / 150;
  160 px (620 k) 70 / 65 and 72 / 75; 224 px (1.2 M) 31.3 / 31.6, where the memory order needs
  1.55 GiB of temporaries instead of 2.05 and a cold run reaches its first step sooner.
  `configs/default.py` (ViT-Mu/7 at batch 64: 70 k values) trained its 3,600 steps in 83 s with
  XLA's order against 89 s, the same losses.

Programs that import vit_jax as a library can put the same flags in XLA_FLAGS themselves.
"""

import os
from typing import Mapping, MutableMapping, Optional, Sequence

from vit_jax.errors import UserError

# config.xla_cpu_schedule -> the flags it adds ('concurrency' is XLA's default: nothing to add).
SCHEDULES = {
    'memory': ('--xla_cpu_enable_concurrency_optimized_scheduler=false',),
    'concurrency': (),
}
CHOICES = ('auto', *SCHEDULES)  # config.xla_cpu_schedule's valid values
DEFAULT_SCHEDULE = 'auto'  # configs/common.py's
AUTO_MEMORY_FROM = 2 ** 20  # values in the step's largest activation (4 MiB in fp32)


def _name(flag: str) -> str:
  return flag.split('=', 1)[0]


def with_defaults(current: str, flags: Sequence[str]) -> str:
  """`current` (an XLA_FLAGS value) with each of `flags` that it does not set appended."""
  present = {_name(f) for f in current.split()}
  added = [f for f in flags if _name(f) not in present]
  return ' '.join([current.strip(), *added]).strip()


def _value(env: Mapping[str, str], name: str) -> Optional[str]:
  """The value `env`'s XLA_FLAGS gives flag `name` (its last setting; '' for a bare flag), or
  None when it is not set."""
  values = [f.partition('=')[2] for f in env.get('XLA_FLAGS', '').split() if _name(f) == name]
  return values[-1] if values else None


def _cpu_devices(env: Mapping[str, str]) -> int:
  count = _value(env, '--xla_force_host_platform_device_count') or ''
  return max(int(count), 1) if count.isdigit() else 1  # unset: 1; a bad value: XLA refuses it


def _batch_ways(config, devices: int) -> int:
  """The devices that split a step's batch (`parallel.sharding.batch_ways` of the config's mesh on
  `devices`: a tensor-parallel axis holds the same residual stream on each of its devices); all
  of them without a mesh, or when the mesh does not fit these devices (the program's own check
  reports that)."""
  if config.get('mesh') is None:
    return devices
  from vit_jax.parallel import mesh as mesh_lib, sharding  # pylint: disable=g-import-not-at-top
  try:
    sizes = mesh_lib.mesh_shape(config.mesh, devices)
  except UserError:
    return devices
  return sharding.batch_ways(dict(zip(mesh_lib.AXES, sizes)))


def largest_activation(config, env: Mapping[str, str] = os.environ, processes: int = 1) -> int:
  """Values in the largest activation of `config`'s train step on one CPU device
  (`models.cost.largest_activation` of a micro-batch: batch / accum_steps / the devices that
  split the batch, `_batch_ways` of the CPU devices of XLA_FLAGS in each of `processes`: the
  batch is global, so a run of several processes splits it over all of their devices)."""
  from vit_jax.models import cost  # pylint: disable=g-import-not-at-top (keeps configs light)
  ways = _batch_ways(config, _cpu_devices(env) * max(processes, 1))
  batch = config.batch_size // max(config.get('accum_steps') or 1, 1) // ways
  return cost.largest_activation(config.model_name, config.image_size, max(batch, 1))


def resolve(config, env: Mapping[str, str] = os.environ, processes: int = 1) -> str:
  """`config.xla_cpu_schedule` (validated; absent or None: the default) with 'auto' decided for
  a run of `processes` processes."""
  name = config.get('xla_cpu_schedule') or DEFAULT_SCHEDULE
  if name == 'auto':
    big = largest_activation(config, env, processes) >= AUTO_MEMORY_FROM
    return 'memory' if big else 'concurrency'
  return name


def schedule_flags(config, env: Mapping[str, str] = os.environ,
                   processes: int = 1) -> Sequence[str]:
  """The flags of `config.xla_cpu_schedule` (`resolve`) for a run of `processes` processes."""
  return SCHEDULES[resolve(config, env, processes)]


def in_effect(env: Mapping[str, str] = os.environ) -> str:
  """The schedule XLA:CPU compiles with under `env`'s XLA_FLAGS ('memory' or 'concurrency')."""
  value = _value(env, _name(SCHEDULES['memory'][0]))
  return 'memory' if value is not None and value.lower() in ('false', '0') else 'concurrency'


def apply(env: MutableMapping[str, str], flags: Sequence[str]) -> None:
  """Sets XLA_FLAGS in `env` to `with_defaults` of its value. Call it before JAX's first device:
  XLA reads XLA_FLAGS once per process."""
  value = with_defaults(env.get('XLA_FLAGS', ''), flags)
  if value != env.get('XLA_FLAGS', ''):
    env['XLA_FLAGS'] = value


__all__ = ['AUTO_MEMORY_FROM', 'CHOICES', 'DEFAULT_SCHEDULE', 'SCHEDULES', 'apply',
           'in_effect', 'largest_activation', 'resolve', 'schedule_flags', 'with_defaults']
