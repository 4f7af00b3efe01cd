"""Ctrl-C while a command starts: one line, even when Python swallows the KeyboardInterrupt.

SIGINT raises KeyboardInterrupt in whatever Python code runs at that moment; when that is a
garbage-collection callback or a `__del__` (JAX and TensorFlow run some), Python prints
"Exception ignored ... KeyboardInterrupt" with a traceback and goes on as if nothing happened.
`install()` (done by every command-line entry point) makes SIGINT raise as usual and also
remember it; such a swallowed interrupt is then not printed, and `check()` (called where a
command would start work that a Ctrl-C must not silently skip past, e.g. before training) raises
it again. While a module is being imported the interrupt is only remembered: a KeyboardInterrupt
raised inside an extension module's initialisation crashed the interpreter (a segmentation fault
loading jaxlib, seen in tests/test_reliability.py), so `check()` raises it once imports are done. Handlers installed later (the trainer's preemption handler, the sweep's) take over.
"""

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


__all__ = ['install', 'check']
