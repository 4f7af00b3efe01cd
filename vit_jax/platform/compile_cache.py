"""The persistent XLA compilation cache of command-line runs: on by default, one switch to turn off.

A rerun, a resumed run, each run of a sweep, predict and analyze compile the same programs again;
with the cache they load the compiled executables instead. JAX keys entries by the program, the
compile options and the backend, so a hit is the same executable.

  VIT_JAX_COMPILATION_CACHE unset   ~/.cache/vit_jax/xla/<host> ($XDG_CACHE_HOME if set): a local
                                    disk on a laptop and on every worker of a Cloud TPU VM
  VIT_JAX_COMPILATION_CACHE=DIR     that directory (local, or gs://... shared by a pod's workers)
  VIT_JAX_COMPILATION_CACHE=off     no persistent cache (also 0, false, no)

JAX's own JAX_COMPILATION_CACHE_DIR, when set, wins. <host> names the processor (machine type and
a hash of the CPU model and feature flags, `cpus.fingerprint`): XLA:CPU compiles for the host's
vector extensions, so a home directory shared by machines with different processors must not
share CPU executables.
JAX's own settings decide which programs are stored (by default those that took a second or more
to compile: JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS).
"""

import os
from typing import Mapping, Optional

from vit_jax import fileio
from vit_jax.platform import cpus

ENV = 'VIT_JAX_COMPILATION_CACHE'
OFF = ('0', 'off', 'false', 'no')
MAX_BYTES = 4 * 2 ** 30  # least recently used entries are evicted beyond this


def cache_dir(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """The cache directory command-line runs should use, or None (off, or set through JAX)."""
  env = os.environ if environ is None else environ
  if env.get('JAX_COMPILATION_CACHE_DIR'):
    return None  # JAX reads it itself
  value = env.get(ENV)
  if value is not None:
    return None if value.strip().lower() in OFF or not value.strip() else value
  return fileio.user_cache('xla', cpus.fingerprint(), environ=env)


def enable() -> Optional[str]:
  """Turns the cache on for this process as `cache_dir()` says; returns the directory used."""
  directory = cache_dir()
  if directory is None:
    return None
  import jax  # pylint: disable=g-import-not-at-top  # cli imports this module: --help stays light
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_compilation_cache_max_size', MAX_BYTES)
  return directory


__all__ = ['ENV', 'cache_dir', 'enable']
