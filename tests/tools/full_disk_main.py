"""`python -m vit_jax.main` on a disk that fills up: every file orbax opens for writing inside
checkpoint step >= $FULL_DISK_FROM_STEP fails with ENOSPC, as on a full disk (orbax's commit goes
through these writes, so the failure takes the same path as a real ENOSPC; the array data is
written by tensorstore and is left incomplete in the temporary step directory)."""

import errno
import os
import re
import runpy
import sys

from etils import epath

_FROM = int(os.environ['FULL_DISK_FROM_STEP'])
_STEP = re.compile(r'/checkpoints/(\d+)')
_open = epath.gpath._GPath.open  # pylint: disable=protected-access


def _full_disk_open(self, mode='r', *args, **kwargs):
  match = _STEP.search(os.fspath(self))
  if match and int(match.group(1)) >= _FROM and any(c in mode for c in 'wax+'):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self))
  return _open(self, mode, *args, **kwargs)


epath.gpath._GPath.open = _full_disk_open  # pylint: disable=protected-access
sys.argv[0] = 'vit_jax.main'
runpy.run_module('vit_jax.main', run_name='__main__', alter_sys=True)
