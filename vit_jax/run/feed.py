"""The train batches, fetched on a helper thread so that signals reach the loop while the input is
blocked.

Python runs a signal handler only between bytecodes of the main thread: while the main thread
waits inside a TensorFlow call for the next batch (a read that hangs on a file system, a
pipeline that yields nothing), a SIGTERM or SIGHUP would wait with it. `Feed.next` instead asks
a helper thread for the batch and waits in short slices, in which the handlers run; when the
loop's `stop()` turns true before the batch arrives, it returns None and the loop saves the
last step and exits, as for any preemption. A batch is fetched only when asked for (no read
ahead beyond the pipeline's own), and an error of the iterator is raised in the main thread.
"""

import queue
import threading
from typing import Callable, Iterator

_SLICE_S = 0.2  # how often a wait looks at `stop()`


class Feed:
  """`next(stop)`: the iterator's next item, or None if `stop()` held before it came."""

  def __init__(self, iterator: Iterator):
    self._iterator = iterator
    self._asked = threading.Semaphore(0)
    self._results = queue.Queue(maxsize=1)
    self._pending = False
    self._closed = False
    threading.Thread(target=self._fetch, name='vit_jax-input', daemon=True).start()

  def _fetch(self) -> None:
    while True:
      self._asked.acquire()
      if self._closed:
        break
      try:
        self._results.put((True, next(self._iterator)))
      except BaseException as e:  # pylint: disable=broad-except  # raised in the main thread
        self._results.put((False, e))
        break
    self._iterator = None  # the pipeline (and its buffers) is let go once the feed ends

  def close(self) -> None:
    """Ends the helper thread (after a fetch under way, if any); `next` is not called again."""
    self._closed = True
    self._asked.release()

  def next(self, stop: Callable[[], bool]):
    if not self._pending:
      self._asked.release()
      self._pending = True
    while True:
      try:
        ok, value = self._results.get(timeout=_SLICE_S)
      except queue.Empty:
        if stop():
          return None
        continue
      self._pending = False
      if not ok:
        raise value
      return value


__all__ = ['Feed']
