"""Where metrics go: a JSONL log, TensorBoard event files, a progress line, a learning-curve PNG.

Only process 0 writes. Each record is one JSON object per line: {"step": .., "split": "train"|
"eval", <metric>: float, ...}. Train records from the second on also carry `img_per_s` and `mfu`
(`Throughput`: model FLOPs utilisation over the steps since the previous record). Files go through
`fileio`, so the workdir may be a local path or a bucket (gs://...), as on a TPU pod; TensorFlow
is imported for a bucket only.
"""

import contextlib
import io
import json
import os
import sys
import time
from typing import Callable, Optional

from vit_jax import fileio
from vit_jax.run import curve
from vit_jax.run import events
from vit_jax.errors import UserError


def metrics_path(workdir: str) -> str:
  return os.path.join(workdir, 'metrics.jsonl')


class WriteError(UserError):
  """A metric file that cannot be written (disk full, permissions): says which and why."""


def _process_index() -> int:
  import jax  # pylint: disable=g-import-not-at-top  # reading logs (a sweep) needs no JAX
  return jax.process_index()


class Throughput:
  """img/s and MFU between consecutive train records: (steps since the previous record) x batch
  / wall time, and that times the model's FLOPs per image (`models.cost.train_flops`) over the
  peak FLOP/s of the run's devices (`platform.chips.peak_flops`). The first train record, whose
  time holds the compilation, gets none; any other record (an evaluation) restarts the clock, so
  its time is not counted."""

  def __init__(self, batch_size: int, flops_per_image: float, peak_flops: float,
               clock: Callable[[], float] = time.perf_counter):
    self.batch_size, self.flops_per_image, self.peak_flops = batch_size, flops_per_image, peak_flops
    self._clock = clock
    self._mark = None  # (step, time) the next interval starts at

  def mark(self, step: int) -> None:
    self._mark = (step, self._clock())

  def measure(self, step: int) -> dict:
    """{'img_per_s', 'mfu'} since the mark (empty without one, or for no steps), then marks."""
    start, now = self._mark, self._clock()
    self._mark = (step, now)
    if start is None or step <= start[0] or now <= start[1]:
      return {}
    img_per_s = (step - start[0]) * self.batch_size / (now - start[1])
    return {'img_per_s': img_per_s, 'mfu': img_per_s * self.flops_per_image / self.peak_flops}


def throughput_for(model, image_shape, batch_size: int, devices, dtype: str) -> Throughput:
  """The `Throughput` of a run of `model` on `devices`: datasheet peaks for known chips, on a CPU
  the measured matmul rate of this process's cores (times the processes)."""
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.models import cost  # pylint: disable=g-import-not-at-top
  from vit_jax.platform import chips  # pylint: disable=g-import-not-at-top
  measure = lambda d: jax.process_count() * chips.measure_matmul_flops(d, size=1024, repeats=3)
  peak, _ = chips.peak_flops(list(devices), str(dtype), measure=measure)
  return Throughput(batch_size, cost.train_flops(model, image_shape), peak)


class MetricLogger:
  """Writes metrics to <workdir>/metrics.jsonl and <workdir>/tensorboard/; with a `throughput`,
  train records get img/s and MFU.

  A failed write (disk full, permissions) raises `WriteError` naming the file; what was written
  before stays. The files are opened at the first record, so a run refused before it logs
  anything (the data or an evaluator refused after the logger was made) leaves none."""

  def __init__(self, workdir: str, *, enabled: bool | None = None,
               throughput: Optional[Throughput] = None):
    self.throughput = throughput
    self.enabled = _process_index() == 0 if enabled is None else enabled
    self.path = metrics_path(workdir)
    self.tb_dir = os.path.join(workdir, 'tensorboard')
    self._tb = self._jsonl = None

  def _open(self) -> None:
    with _writing(self.tb_dir):
      self._tb = events.EventWriter(self.tb_dir)
    with _writing(self.path):  # one appending writer: on GCS every flush re-uploads the object
      self._jsonl = fileio.files_for(self.path).GFile(self.path, 'a')

  def write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    if self._jsonl is None:
      self._open()
    if self.throughput is not None:
      if split == 'train':
        metrics = {**metrics, **self.throughput.measure(step)}
      else:
        self.throughput.mark(step)
    record = {'step': int(step), 'split': split, **{k: float(v) for k, v in metrics.items()}}
    with _writing(self.path):
      self._jsonl.write(json.dumps(record) + '\n')
      self._jsonl.flush()
    with _writing(self.tb_dir):
      self._tb.scalars(step, {f'{split}/{k}': v for k, v in metrics.items()})
      self._tb.flush()

  def close(self) -> None:
    tb, jsonl, self._tb, self._jsonl = self._tb, self._jsonl, None, None
    try:
      if tb is not None:
        with _writing(self.tb_dir):
          tb.close()
    finally:
      if jsonl is not None:
        with _writing(self.path):
          jsonl.close()


@contextlib.contextmanager
def _writing(path: str):
  """Turns a failed write (disk full, permissions: OSError, and tf.errors.OpError for a remote
  path) into WriteError."""
  try:
    yield
  except fileio.errors_for(path) as e:
    raise WriteError(f'cannot write the metrics to {path} ({fileio.error_reason(e)})') from None


def read_metrics(path: str) -> list[dict]:
  """The records of a JSONL log. A line that is not a complete record is skipped: the last line
  cut short by a killed process, or such a line that an older run appended after (`repair_log`
  removes them from the file when a run starts)."""
  return [record for _, record in _records(_read(path))]


def _read(path: str) -> bytes:
  files = fileio.files_for(path)  # a sweep reading its runs' logs needs no TensorFlow
  if not files.exists(path):
    return b''
  with files.GFile(path, 'rb') as f:
    return f.read()


def _records(data: bytes) -> list:
  """(line, record) of each complete record, in order (after the last newline: a torn line)."""
  out = []
  for line in data.split(b'\n')[:-1]:
    try:
      record = json.loads(line.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError):
      continue
    if (isinstance(record, dict) and isinstance(record.get('step'), int) and
        isinstance(record.get('split'), str)):
      out.append((line, record))
  return out


def repair_log(path: str, step: int) -> None:
  """Keeps the complete records of steps <= `step` (those of the checkpoint a run resumes from;
  0 on a fresh start, which empties the log) and drops torn lines. Rewrites the file (through a
  temporary file and a rename) only when something is dropped. A local log needs no TensorFlow."""
  data = _read(path)
  kept = b''.join(line + b'\n' for line, record in _records(data) if record['step'] <= step)
  if kept == data:
    return
  files = fileio.files_for(path)
  with files.GFile(path + '.tmp', 'wb') as f:
    f.write(kept)
  files.rename(path + '.tmp', path, overwrite=True)


def plot_learning_curve(metrics_path: str, out_png: str) -> None:
  """Train and eval loss and accuracy against step, from the JSONL log (curve.py)."""
  out = io.BytesIO()
  curve.render(read_metrics(metrics_path)).save(out, format='PNG')
  with fileio.files_for(out_png).GFile(out_png, 'wb') as f:
    f.write(out.getvalue())


class Progress:
  """A one-line progress report on stderr: step, loss, img/s and ETA."""

  def __init__(self, total_steps: int, start_step: int, batch_size: int, *, enabled: bool):
    self.total, self.batch = total_steps, batch_size
    self.enabled = enabled and _process_index() == 0
    self._t0, self._s0 = time.perf_counter(), start_step
    self._tty = sys.stderr.isatty()

  def restart_clock(self, step: int) -> None:
    """Excludes compilation from the rate: call after the first step finished."""
    self._t0, self._s0 = time.perf_counter(), step

  def update(self, step: int, loss: float) -> None:
    if not self.enabled:
      return
    elapsed = time.perf_counter() - self._t0
    done = step - self._s0
    rate = done / elapsed if elapsed > 0 and done > 0 else 0.0
    eta = (self.total - step) / rate if rate else float('nan')
    line = (f'step {step}/{self.total} ({100 * step / self.total:.0f}%)  loss {loss:.4f}  '
            f'{rate * self.batch:.0f} img/s  ETA {_fmt(eta)}')
    if self._tty:
      sys.stderr.write('\r' + line.ljust(80))
      sys.stderr.flush()
    else:
      print(line, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.enabled and self._tty:
      sys.stderr.write('\n')


def _fmt(seconds: float) -> str:
  if seconds != seconds:  # nan
    return '?'
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f'{h}h{m:02d}m' if h else f'{m}m{s:02d}s'
