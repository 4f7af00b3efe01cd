"""`python -m vit_jax <command> [flags]` (console script: `vit-jax <command> [flags]`).

Runs vit_jax/commands/<command>.py as the main module with the flags after the command name, as
`python -m vit_jax.<module>` did: its --help shows its docstring and flags. Only that command's
module is imported. `python -m vit_jax --help` lists the commands.
"""

import _signal  # pylint: disable=g-bad-import-order  # built in and already loaded
_signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})  # held until interrupt.install()

from vit_jax import interrupt  # pylint: disable=g-bad-import-order,wrong-import-position
interrupt.install()  # first: a Ctrl-C while the command's modules load is one line, no traceback

import runpy  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.cli import EXIT_USER_ERROR, HELP_FLAGS  # pylint: disable=wrong-import-position
from vit_jax.commands import COMMANDS


def usage(prog: str) -> str:
  width = max(map(len, COMMANDS))
  lines = [f'usage: {prog} <command> [flags]   ({prog} <command> --help: its flags)', '',
           'commands:']
  lines += [f'  {name:<{width}}  {line}' for name, line in COMMANDS.items()]
  return '\n'.join(lines) + '\n'


def main(argv=None, prog: str = None) -> int:
  argv = sys.argv if argv is None else argv
  prog = prog or ('python -m vit_jax' if argv[0].endswith('__main__.py') else 'vit-jax')
  if len(argv) < 2 or argv[1] in HELP_FLAGS | {'help'}:
    sys.stdout.write(usage(prog))
    return 0
  command = argv[1]
  if command not in COMMANDS:
    print(f'error: unknown command {command!r}: use one of {", ".join(COMMANDS)} '
          f'(e.g. {prog} train --help)', file=sys.stderr, flush=True)
    return EXIT_USER_ERROR
  sys.argv = [argv[0], *argv[2:]]  # absl sees the command's flags only
  runpy.run_module(f'vit_jax.commands.{command}', run_name='__main__', alter_sys=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
