"""Ctrl-C while a command starts: one line, even when Python swallows the KeyboardInterrupt.

SIGINT raises KeyboardInterrupt in whatever Python code runs at that moment; when that is a
garbage-collection callback or a `__del__` (JAX and TensorFlow run some), Python prints
"Exception ignored ... KeyboardInterrupt" with a traceback and goes on as if nothing happened.
`install()` (done by every command-line entry point) makes SIGINT raise as usual and also
remember it; such a swallowed interrupt is then not printed, and `check()` (called where a
command would start work that a Ctrl-C must not silently skip past, e.g. before training) raises
it again. While a module is being imported the interrupt is only remembered: a KeyboardInterrupt
raised inside an extension module's initialisation can crash the interpreter (a segmentation fault
loading jaxlib), so `check()` raises it once imports are done. Handlers installed later (the
trainer's preemption handler, the sweep's) take over.

A closed terminal or output pipe (`... | head -1`, an SSH connection that ended) must not stop a
command either: `survive_closed_output()` makes stdout and stderr drop their output from then on
(their file descriptors pointed at /dev/null) instead of raising BrokenPipeError or EIO.
"""

import errno
import os
import signal
import sys
import threading

_pending = []


def _importing(frame) -> bool:
  """True while a module is being imported (a frame of importlib's bootstrap is on the stack)."""
  while frame is not None:
    if frame.f_code.co_filename.startswith('<frozen importlib._bootstrap'):
      return True
    frame = frame.f_back
  return False


def _handle(signum, frame):
  del signum
  _pending.append(True)
  if _importing(frame):
    return  # raised inside an extension module's initialisation (jaxlib's) it can segfault
  raise KeyboardInterrupt


def _unraisable(hook):
  def quiet_about_interrupts(unraisable):
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _pending:
      return  # remembered: check() raises it where it can stop the command
    hook(unraisable)
  return quiet_about_interrupts


def install() -> None:
  if threading.current_thread() is not threading.main_thread():
    return
  if signal.getsignal(signal.SIGINT) is not _handle:
    signal.signal(signal.SIGINT, _handle)
    sys.unraisablehook = _unraisable(sys.unraisablehook)


def check() -> None:
  """Raises KeyboardInterrupt if a Ctrl-C came and was swallowed."""
  if _pending:
    _pending.clear()
    raise KeyboardInterrupt


# A reader that went away: a closed pipe (EPIPE), a terminal hung up (EIO), a socket reset.
_READER_GONE = (errno.EPIPE, errno.EIO, errno.ECONNRESET, errno.ENXIO)


class _DropsWhenClosed:
  """A text stream whose writes never fail because its reader is gone: the first such failure
  points the file descriptor at /dev/null (the text still buffered goes there too)."""

  def __init__(self, stream):
    self._stream = stream

  def _reader_gone(self, error: OSError) -> None:
    if error.errno not in _READER_GONE:
      raise error
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
      os.dup2(devnull, self._stream.fileno())
    finally:
      os.close(devnull)

  def write(self, text):
    try:
      return self._stream.write(text)
    except OSError as e:
      self._reader_gone(e)
      return len(text)

  def writelines(self, lines):
    for line in lines:
      self.write(line)

  def flush(self):
    try:
      self._stream.flush()
    except OSError as e:
      self._reader_gone(e)
      try:
        self._stream.flush()  # the buffered text, now to /dev/null
      except OSError:
        pass

  def __getattr__(self, name):
    return getattr(self._stream, name)


def survive_closed_output() -> None:
  """Makes sys.stdout and sys.stderr drop their output once their reader is gone."""
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, _DropsWhenClosed):
      try:
        stream.fileno()
      except (OSError, ValueError, AttributeError):  # not a real file (captured in a test)
        continue
      setattr(sys, name, _DropsWhenClosed(stream))


__all__ = ['install', 'check', 'survive_closed_output']
