"""TensorBoard event files without TensorFlow: scalar summaries (`Summary.Value.simple_value`,
which TensorBoard shows as scalars) framed as TFRecords, through `fileio` (a local path with
Python's files, gs:// and the like with tf.io.gfile). The protobufs and the record checksum are
the `tensorboard` package's own, so `tf.summary` (and TensorFlow) is not needed."""

import itertools
import os
import socket
import time

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from vit_jax import fileio

# Two writers of one process in one second get two files, named in the order they were made:
# TensorBoard reads a directory's event files in the sorted order of their names, so the serial is
# zero-padded (unpadded, a process's 10th writer sorted before its 9th and a resumed run's steps
# came first).
_SERIAL = itertools.count()


class EventWriter:
  """Appends events to a new `events.out.tfevents.*` file in `logdir` (created if missing).
  `file` is the open file (writes are buffered until `flush`)."""

  def __init__(self, logdir: str):
    files = fileio.files_for(logdir)
    files.makedirs(logdir)
    name = (f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.'
            f'{next(_SERIAL):06d}.v2')
    self.path = os.path.join(logdir, name)
    self.file = files.GFile(self.path, 'wb')
    self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def scalars(self, step: int, values: dict) -> None:
    """One event at `step` with a scalar per tag."""
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
    self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def _write(self, event: event_pb2.Event) -> None:
    # tensorboard's TFRecord framing, on whatever `file` is now (a test may wrap it).
    record_writer.RecordWriter(self.file).write(event.SerializeToString())

  def flush(self) -> None:
    self.file.flush()

  def close(self) -> None:
    self.file.close()


__all__ = ['EventWriter']
