"""The processor cores this process may run on (its affinity mask, where the OS has one)."""

import os


def usable() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


__all__ = ['usable']
