"""`python -m vit_jax.main` whose checkpoint restore runs under a real memory limit: just before
each restore, the address space (RLIMIT_AS) is capped at what the process already maps plus
$MEMORY_LIMIT_MARGIN bytes, so the restore fails for want of memory as on a machine that has too
little for it (nothing is faked: the allocation itself fails); with MEMORY_LIMIT_KEEP=1 the cap
stays for the rest of the run. Give the margin room for the
restore's threads and less than its arrays need: a thread that fails to start for want of memory
can hang Python's `Thread.start`. The train step, which a resumed run
compiles on another thread while it restores, is compiled first, so that only the restore meets
the limit."""

import os
import resource
import runpy
import sys

from vit_jax.checkpoint import train_ckpt
from vit_jax.train import program

_MARGIN = int(os.environ.get('MEMORY_LIMIT_MARGIN', '0'))
# MEMORY_LIMIT_KEEP=1: the limit stays once the restore is done, for the run's next steps (the
# input pipeline's start, which imports TensorFlow; the evaluation's compile).
_KEEP = os.environ.get('MEMORY_LIMIT_KEEP') == '1'
_restore = train_ckpt.Checkpointer.restore


def _restore_under_a_limit(self, *args, **kwargs):
  with open('/proc/self/statm') as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
  before = resource.getrlimit(resource.RLIMIT_AS)
  resource.setrlimit(resource.RLIMIT_AS, (mapped + _MARGIN, before[1]))
  try:
    return _restore(self, *args, **kwargs)
  finally:  # the limit is the restore's: what the trainer does about its failure runs without
    if not _KEEP:
      resource.setrlimit(resource.RLIMIT_AS, before)


_compile = program.Program.compile_train_step_in_background


def _compile_first(self):
  future = _compile(self)
  future.result()
  return future


program.Program.compile_train_step_in_background = _compile_first
train_ckpt.Checkpointer.restore = _restore_under_a_limit
sys.argv[0] = 'vit_jax.main'
runpy.run_module('vit_jax.main', run_name='__main__', alter_sys=True)
