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

A Ctrl-C is never lost at start-up: the huge-page restart (vit_jax/platform/hostmem.py) re-executes
the process inside `held()`, which blocks SIGINT, so one that comes from then on stays pending
across the exec (a blocked signal is kept by execve) and the new program's `install()` unblocks
it once its handler is in place; one that came before is raised by `check()` instead of the exec.

A closed terminal or output pipe (`... | head -1`, an SSH connection that ended) must not stop a
command either: `survive_closed_output()` makes stdout and stderr drop their output from then on
(their file descriptors pointed at /dev/null) instead of raising BrokenPipeError or EIO. A full
device (`>/dev/full`, a full disk, a quota) is dropped the same way, and remembered:
`lost_output()` names the file so that the command can end with one error line (the work itself
goes on to its end). A standard stream closed at start (`>&-`, `2>&-`), or open only for the other
direction (what a wrapper script run as `bash run.sh 2>&-` passes on), is opened on /dev/null by
`install()`, before any file the command opens could take its descriptor.
"""

import contextlib
import errno
import fcntl
import io
import os
import signal
import sys
import threading
from typing import Optional

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


_silenced = []


def _closed_loop(unraisable) -> bool:
  """A callback into an asyncio event loop that is gone (tensorstore finishing a read or write
  that orbax stopped waiting for): nothing is lost, there is nobody left to tell."""
  return issubclass(unraisable.exc_type, RuntimeError) and (
      str(unraisable.exc_value) == 'Event loop is closed')


def _unraisable(hook):
  def quiet_about_interrupts(unraisable):
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _pending:
      return  # remembered: check() raises it where it can stop the command
    if _silenced or _closed_loop(unraisable):
      return
    hook(unraisable)
  return quiet_about_interrupts


def _thread_exception(hook):
  def quiet_after_the_error_line(args):
    if not _silenced:
      hook(args)
  return quiet_after_the_error_line


def install() -> None:
  """The SIGINT handler, the quiet hooks and open standard streams (first thing a command does);
  a SIGINT held across the huge-page restart is delivered here (remembered for `check()`)."""
  if threading.current_thread() is not threading.main_thread():
    return
  _open_closed_standard_streams()
  if signal.getsignal(signal.SIGINT) is not _handle:
    signal.signal(signal.SIGINT, _handle)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    threading.excepthook = _thread_exception(threading.excepthook)
  if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
    try:
      signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
      _delivered()
    except KeyboardInterrupt:  # remembered (by _handle): check() raises it
      pass


def _delivered() -> None:
  """Nothing: calling a Python function is where the interpreter runs the handlers of signals
  that have arrived."""


@contextlib.contextmanager
def held():
  """SIGINT blocked inside: one that comes stays pending (across an exec too) and is delivered
  when the block ends; one that came before is raised on entry."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    _delivered()  # one already caught by the interpreter runs its handler now
    check()
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _delivered()


_MODES = {0: (os.O_RDONLY, 'r'), 1: (os.O_WRONLY, 'w'), 2: (os.O_WRONLY, 'w')}


def _usable(fd: int, flags: int) -> bool:
  """Whether `fd` is open for its direction (`flags`: O_RDONLY or O_WRONLY). A shell that runs a
  script with fd 2 closed (`bash run.sh 2>&-`) opens the script on that lowest free number and
  hands it, read-only, to the program the script `exec`s: open, yet every write fails."""
  try:
    mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
  except OSError:
    return False
  return mode in (flags, os.O_RDWR)


def _open_closed_standard_streams() -> None:
  """A standard file descriptor closed at start, or open only the other way, is opened on
  /dev/null (else the next file the command opens would take its number, and C libraries' writes
  to fd 1 or 2 would land in it or fail), and Python's sys.stdin/stdout/stderr (None when it was
  closed) get a stream on it."""
  for fd, (flags, mode) in _MODES.items():
    if _usable(fd, flags):
      continue
    devnull = os.open(os.devnull, flags)
    if devnull != fd:
      os.dup2(devnull, fd)
      os.close(devnull)
    name = ('stdin', 'stdout', 'stderr')[fd]
    if getattr(sys, name) is None:
      setattr(sys, name, open(fd, mode, closefd=False,  # pylint: disable=consider-using-with
                              buffering=1 if mode == 'w' else -1))


def silence() -> None:
  """Once a command has printed its one error line: what its background threads (orbax's and
  tensorstore's, failing after the failure was handled) would still print is dropped, Python's
  "Exception ignored" reports and the native libraries' writes to fd 2 alike."""
  _silenced.append(True)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, AttributeError):
      pass
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
  finally:
    os.close(devnull)


def check() -> None:
  """Raises KeyboardInterrupt if a Ctrl-C came and was swallowed."""
  if _pending:
    _pending.clear()
    raise KeyboardInterrupt


# A reader that went away: a closed pipe (EPIPE), a terminal hung up (EIO), a socket reset.
_READER_GONE = (errno.EPIPE, errno.EIO, errno.ECONNRESET, errno.ENXIO)
# A file that cannot take more: a full device or disk, a quota, a file size limit.
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_lost = {}  # stream name -> (the file it wrote to, the reason), for lost_output()


def _target(fd: int) -> str:
  try:
    return os.readlink(f'/proc/self/fd/{fd}')
  except OSError:
    return f'file descriptor {fd}'


class _DropsWhenClosed:
  """A text stream whose writes never fail because its reader is gone or its file is full: the
  first such failure points the file descriptor at /dev/null (the text still buffered goes there
  too); a full file is remembered for `lost_output()`."""

  def __init__(self, stream, name: str):
    self._stream = stream
    self._name = name

  def _reader_gone(self, error: OSError) -> None:
    if error.errno not in _READER_GONE + _FULL:
      raise error
    fd = self._stream.fileno()
    if error.errno in _FULL:
      _lost.setdefault(self._name, (_target(fd), os.strerror(error.errno)))
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
      os.dup2(devnull, fd)
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
  """Makes sys.stdout and sys.stderr drop their output once their reader is gone or their file
  is full."""
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name)
    if stream is not None and not isinstance(stream, _DropsWhenClosed):
      try:
        stream.fileno()
      except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # captured (tests)
        continue
      setattr(sys, name, _DropsWhenClosed(stream, name))


def lost_output() -> Optional[str]:
  """'standard output (/dev/full: No space left on device)' when the command's standard output
  met a full file and the rest of it was dropped; None otherwise. (Standard error is only
  diagnostics: what a full file drops of it is not reported.)"""
  try:
    sys.stdout.flush()  # what is still buffered meets the full file now
  except (OSError, ValueError, AttributeError):
    pass
  if 'stdout' not in _lost:
    return None
  path, reason = _lost['stdout']
  return f'standard output ({path}: {reason})'


__all__ = ['check', 'held', 'install', 'lost_output', 'silence', 'survive_closed_output']
