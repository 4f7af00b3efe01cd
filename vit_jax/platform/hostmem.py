"""Transparent huge pages for glibc malloc in every command-line run.

XLA:CPU allocates a step's temporaries afresh every step, blocks large enough that glibc serves
each with its own mmap, so every step faults all their pages in again. With glibc's
`glibc.malloc.hugetlb=1` tunable malloc asks for transparent huge pages (madvise), 512 times
fewer faults for the same memory.

glibc reads tunables only when a process starts, so the command-line entry points (`cli.run_main`)
restart themselves once, same PID, same arguments, with the tunable added to GLIBC_TUNABLES. This
happens only on Linux with glibc >= 2.35 and THP in 'madvise' mode ('always' needs nothing;
'never' gives nothing). VIT_JAX_HUGEPAGES=0 turns it off. Programs that import vit_jax as a
library can start Python with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` themselves. The caller holds
SIGINT blocked across the restart (`vit_jax.interrupt.held`), so that a Ctrl-C is not lost in it.
"""

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
  for stream in (sys.stdout, sys.stderr):  # None when closed at start (`>&-`)
    try:
      stream.flush()
    except (AttributeError, OSError, ValueError):
      pass
  try:
    os.execve(sys.executable, sys.orig_argv, env)
  except OSError:  # cannot restart (unusual interpreter setup): run on without huge pages
    return


__all__ = ['OPT_OUT', 'TUNABLE', 'glibc_version', 'restart_with_hugepages', 'thp_mode',
           'tunables_with_hugepages']
