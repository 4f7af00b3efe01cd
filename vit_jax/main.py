"""Train or fine-tune: `python -m vit_jax.main --config=configs/default.py --workdir=DIR`.

The original's entry point, kept: the same as `python -m vit_jax train` (vit_jax/commands/train.py,
which documents the flags).
"""

import _signal  # built in and already loaded
import runpy

if __name__ == '__main__':
  _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})  # held until interrupt.install()
  from vit_jax import interrupt  # pylint: disable=g-import-not-at-top
  interrupt.install()  # first: a Ctrl-C while the modules load is one line, no traceback
  runpy.run_module('vit_jax.commands.train', run_name='__main__', alter_sys=True)
