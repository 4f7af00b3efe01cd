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
  for its config): ViT-Ti/16 inference at batch 32 ran 4% slower with it, so predict, export,
  analyze and `bench --mode=infer` keep XLA's default. The CPU backend's flag: other backends
  ignore it.
  A config chooses with `xla_cpu_schedule` ('memory', the default, or 'concurrency': XLA's own
  order). Where every operation is small, running independent ones together wins and memory does
  not matter: `configs/default.py` (ViT-Mu/7, batch 64 of 17 tokens of width 64) trained its 3,600
  steps in 83 s with XLA's order against 89 s with the memory-minimising one (1,200 steps: 26 and
  28 s against 30 and 31 s; the same losses; AMD EPYC family 26 model 2), so it asks for
  'concurrency'.

Programs that import vit_jax as a library can put the same flags in XLA_FLAGS themselves.
"""

import os
from typing import MutableMapping, Sequence

# config.xla_cpu_schedule -> the flags it adds ('concurrency' is XLA's default: nothing to add).
SCHEDULES = {
    'memory': ('--xla_cpu_enable_concurrency_optimized_scheduler=false',),
    'concurrency': (),
}
DEFAULT_SCHEDULE = 'memory'  # configs/common.py's; the test suite's (tests/conftest.py)
TRAINING = SCHEDULES[DEFAULT_SCHEDULE]


def _name(flag: str) -> str:
  return flag.split('=', 1)[0]


def with_defaults(current: str, flags: Sequence[str] = TRAINING) -> str:
  """`current` (an XLA_FLAGS value) with each of `flags` that it does not set appended."""
  present = {_name(f) for f in current.split()}
  added = [f for f in flags if _name(f) not in present]
  return ' '.join([current.strip(), *added]).strip()


def schedule_flags(config) -> Sequence[str]:
  """The flags of `config.xla_cpu_schedule` (validated; absent or None: the default)."""
  return SCHEDULES[config.get('xla_cpu_schedule') or DEFAULT_SCHEDULE]


def apply(env: MutableMapping[str, str] = os.environ, flags: Sequence[str] = TRAINING) -> None:
  """Sets XLA_FLAGS in `env` to `with_defaults` of its value. Call it before JAX's first device:
  XLA reads XLA_FLAGS once per process."""
  value = with_defaults(env.get('XLA_FLAGS', ''), flags)
  if value != env.get('XLA_FLAGS', ''):
    env['XLA_FLAGS'] = value


__all__ = ['DEFAULT_SCHEDULE', 'SCHEDULES', 'TRAINING', 'apply', 'schedule_flags',
           'with_defaults']
