"""Host memory policy: transparent huge pages for glibc malloc in every command-line run.

Why: on XLA:CPU every step allocates its temporaries afresh (about 2 GiB for a ViT-Ti/16 train
step at batch 32) and glibc serves allocations that large with a new mmap, so each step faults in
every page again: 573,104 minor page faults per step (the benchmark's `minor_faults_per_step`,
benchmarks/README.md). With glibc's `glibc.malloc.hugetlb=1` tunable malloc asks for transparent
huge pages (madvise): 1,920 faults per step, 17.46 -> 27.15 img/s. The restart costs about 0.1 s
(0.67-0.71 s against 0.60-0.62 s for a CLI run that exits at once).

glibc reads tunables only when a process starts, so the command-line entry points (`cli.run_main`)
restart themselves once, same PID, same arguments, with the tunable added to GLIBC_TUNABLES. This
happens only on Linux with glibc >= 2.35 and THP in 'madvise' mode ('always' needs nothing;
'never' gives nothing). VIT_JAX_HUGEPAGES=0 turns it off. Programs that import vit_jax as a
library can start Python with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` themselves.
"""

import ctypes
import os
import platform
import sys
from typing import Mapping, Optional

TUNABLE = 'glibc.malloc.hugetlb=1'
OPT_OUT = 'VIT_JAX_HUGEPAGES'
THP_MODE_FILE = '/sys/kernel/mm/transparent_hugepage/enabled'


def thp_mode(path: str = THP_MODE_FILE) -> Optional[str]:
  """The kernel's THP mode ('always', 'madvise', 'never'), or None where there is none."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  for word in text.split():
    if word.startswith('[') and word.endswith(']'):
      return word[1:-1]
  return None


def glibc_version() -> Optional[tuple]:
  name, version = platform.libc_ver()
  if name != 'glibc' or not version:
    return None
  try:
    return tuple(int(p) for p in version.split('.')[:2])
  except ValueError:
    return None


def tunables_with_hugepages(env: Mapping[str, str], mode: Optional[str],
                            libc: Optional[tuple]) -> Optional[str]:
  """The GLIBC_TUNABLES value to restart with, or None when no restart is needed or useful."""
  current = env.get('GLIBC_TUNABLES', '')
  if env.get(OPT_OUT, '1') == '0' or mode != 'madvise' or libc is None or libc < (2, 35):
    return None
  if 'glibc.malloc.hugetlb=' in current:  # already set (by us or by the user): keep it
    return None
  return f'{current}:{TUNABLE}' if current else TUNABLE


def restart_with_hugepages() -> None:
  """Re-executes this process with the tunable when `tunables_with_hugepages` asks for it."""
  value = tunables_with_hugepages(os.environ, thp_mode(), glibc_version())
  if value is None or not getattr(sys, 'orig_argv', None):
    return
  env = dict(os.environ, GLIBC_TUNABLES=value)
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, sys.orig_argv, env)
  except OSError:  # cannot restart (unusual interpreter setup): run on without huge pages
    return


# mallopt(3) parameters (malloc.h): never give freed memory back to the kernel, never serve a
# request with its own mmap, one arena for all threads.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
KEEP_OPT_IN = 'VIT_JAX_KEEP_FREED_MEMORY'


def keep_freed_memory(env: Mapping[str, str] = os.environ) -> bool:
  """Makes glibc keep freed memory for the next allocation instead of returning it to the kernel.

  Why: XLA:CPU allocates a step's temporaries afresh every step (2.05 GiB for a ViT-Ti/16 train
  step at batch 32) in blocks far above glibc's mmap threshold, which glibc serves with their own
  mmap and unmaps on free, so every step faults its temporaries in again (with huge pages: about
  1,400-1,800 faults and 1.0-1.7 s of OS time per step; benchmarks/README.md). With mmap off for
  large requests, trimming off and one arena, the blocks are carved from the heap once and reused
  by every later step (0 faults in most steps). Opt-in (`VIT_JAX_KEEP_FREED_MEMORY=1`): it
  removed the faults but gave no img/s (ViT-Ti/16 b32 train against timm 0.92x with it, 1.00x
  without, one run each, AMD EPYC family 25 model 17; 0.73-0.87x with it against 0.72-0.79x
  without, four alternated pairs, Intel Xeon family 6 model 207), keeps the process at its peak
  memory and serialises malloc on one arena. Returns whether it was applied (glibc only). Call it
  before threads start allocating.
  """
  if env.get(KEEP_OPT_IN, '0') != '1' or glibc_version() is None:
    return False
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  return all(mallopt(param, value) == 1 for param, value in (
      (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_ARENA_MAX, 1)))


__all__ = ['restart_with_hugepages', 'keep_freed_memory', 'tunables_with_hugepages', 'thp_mode', 'glibc_version',
           'TUNABLE', 'OPT_OUT']
