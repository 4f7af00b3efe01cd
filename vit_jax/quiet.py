"""File descriptor 2 pointed elsewhere for a block: `silenced_stderr()`, `stderr_to(file)`.

TensorFlow's C++ code (its banners before absl logging is initialised, libjpeg's warnings on
corrupt files) and libtpu's start-up write to fd 2 directly, ignoring TF_CPP_MIN_LOG_LEVEL and
Python's sys.stderr.
"""

import contextlib
import os
import sys


@contextlib.contextmanager
def stderr_to(file):
  """fd 2 (C and Python writes alike) goes to the open `file` inside the block."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    os.dup2(file.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
  finally:
    os.close(saved)


@contextlib.contextmanager
def silenced_stderr():
  with open(os.devnull, 'w') as null, stderr_to(null):
    yield
