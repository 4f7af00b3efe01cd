"""`silenced_stderr()`: file descriptor 2 pointed at /dev/null for a block.

TensorFlow's C++ code (its banners before absl logging is initialised, libjpeg's warnings on
corrupt files) writes to fd 2 directly, ignoring TF_CPP_MIN_LOG_LEVEL and Python's sys.stderr.
"""

import contextlib
import os
import sys


@contextlib.contextmanager
def silenced_stderr():
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, 'w') as null:
      os.dup2(null.fileno(), 2)
      try:
        yield
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
  finally:
    os.close(saved)
