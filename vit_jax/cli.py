"""What every command-line entry point shares: flag parsing and one-line user errors.

A user mistake (bad flag, bad config value, unknown variant, ...) prints `error: <what and how to
fix>` on stderr and exits 2, without a traceback. Internal bugs keep their traceback.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # keep TensorFlow's C++ banner quiet

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top

EXIT_USER_ERROR = 2


def fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(EXIT_USER_ERROR)


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    cause = e.__cause__ or e.__context__
    if isinstance(cause, UserError):
      fail(str(cause))
    fail(_one_line(str(e)))


def _one_line(message: str) -> str:
  return ' '.join(message.split())


def run_main(fn, *, required_flags=()) -> None:
  """app.run(fn) with flag errors and UserErrors turned into one line and exit code 2."""
  for name in required_flags:
    flags.mark_flag_as_required(name)

  def guarded(argv):
    try:
      return fn(argv)
    except UserError as e:
      fail(str(e))

  app.run(guarded, flags_parser=_parse_flags)


__all__ = ['UserError', 'fail', 'run_main', 'EXIT_USER_ERROR']
