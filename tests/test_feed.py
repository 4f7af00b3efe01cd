"""The train batches' helper thread (vit_jax/run/feed.py): a closed feed ends its thread and lets go
of the iterator, so runs in one process (a notebook, the test suite) do not keep their input
pipelines alive."""

import gc
import threading
import time
import weakref

from vit_jax.run import feed as feed_lib


class _Numbers:
  """An iterator that can be weakly referenced (to see when it is let go)."""

  def __init__(self):
    self.n = 0

  def __iter__(self):
    return self

  def __next__(self):
    self.n += 1
    return self.n


def _input_threads():
  return [t for t in threading.enumerate() if t.name == 'vit_jax-input']


def test_a_closed_feed_ends_its_thread_and_lets_go_of_the_iterator():
  before = len(_input_threads())
  numbers = _Numbers()
  alive = weakref.ref(numbers)
  feed = feed_lib.Feed(numbers)
  del numbers
  assert [feed.next(lambda: False) for _ in range(3)] == [1, 2, 3]
  assert len(_input_threads()) == before + 1
  feed.close()
  deadline = time.monotonic() + 10
  while len(_input_threads()) > before and time.monotonic() < deadline:
    time.sleep(0.01)
  assert len(_input_threads()) == before
  gc.collect()
  assert alive() is None


def test_a_feed_closed_while_a_fetch_is_under_way_ends_after_it():
  release = threading.Event()

  def slow():
    yield 1
    release.wait()
    yield 2

  before = len(_input_threads())
  feed = feed_lib.Feed(slow())
  assert feed.next(lambda: False) == 1
  assert feed.next(lambda: True) is None  # the stop came before the second item
  feed.close()
  assert len(_input_threads()) == before + 1  # still in the fetch
  release.set()
  deadline = time.monotonic() + 10
  while len(_input_threads()) > before and time.monotonic() < deadline:
    time.sleep(0.01)
  assert len(_input_threads()) == before
