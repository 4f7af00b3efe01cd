"""Metric logs go through tf.io.gfile: a bucket workdir (here TF's in-memory ram:// filesystem,
standing in for gs://) gets the same JSONL log, TensorBoard events and learning-curve PNG. The
log is repaired when a run starts: emptied on a fresh start, cut back to the restored step on
resume, torn lines (a kill -9 mid-write) dropped, complete lines kept."""

import itertools
import json
import os
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.run import events
from vit_jax.run import logs


def test_metrics_and_curve_on_a_non_local_filesystem():
  workdir = 'ram://run_logs'
  logger = logs.MetricLogger(workdir, enabled=True)
  logger.write(1, 'train', {'loss': 2.5, 'accuracy': 0.1})
  logger.write(2, 'train', {'loss': 2.0, 'accuracy': 0.3})
  logger.write(2, 'eval', {'loss': 1.9, 'accuracy': 0.4, 'count': 10})
  logger.close()
  records = logs.read_metrics(f'{workdir}/metrics.jsonl')
  assert [(r['step'], r['split'], r['loss']) for r in records] == [
      (1, 'train', 2.5), (2, 'train', 2.0), (2, 'eval', 1.9)]
  assert tf.io.gfile.glob(f'{workdir}/tensorboard/events.out.tfevents.*')
  png = f'{workdir}/learning_curve.png'
  logs.plot_learning_curve(f'{workdir}/metrics.jsonl', png)
  with tf.io.gfile.GFile(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert logs.read_metrics('ram://nothing_here/metrics.jsonl') == []


def _line(step, split='train', **metrics):
  return json.dumps({'step': step, 'split': split, 'loss': 1.0 / step, 'accuracy': 0.1,
                     **metrics}) + '\n'


TORN = '{"step": 7, "split": "tr'  # what a kill -9 in the middle of a write leaves


@pytest.mark.parametrize('text, step, kept', [
    (_line(1) + _line(2) + _line(3) + TORN, 2, _line(1) + _line(2)),
    (_line(1) + _line(2) + TORN, 5, _line(1) + _line(2)),
    (_line(1) + TORN + '\n' + _line(2) + '\xff junk\n' + _line(3), 3,
     _line(1) + _line(2) + _line(3)),
    (_line(1) + _line(2, 'eval'), 0, ''),
    (_line(1) + _line(2), 2, None),
], ids=['resume_cuts_later_steps_and_the_torn_line', 'torn_last_line_only',
        'torn_lines_in_the_middle', 'fresh_start_empties', 'nothing_to_repair'])
def test_repair_log(tmp_path, text, step, kept):
  path = tmp_path / 'metrics.jsonl'
  path.write_bytes(text.encode('utf-8', 'surrogateescape'))
  mtime = os.stat(path).st_mtime_ns
  logs.repair_log(str(path), step)
  if kept is None:
    assert path.read_text() == text and os.stat(path).st_mtime_ns == mtime  # not rewritten
  else:
    assert path.read_text() == kept
  assert not os.path.exists(f'{path}.tmp')


def test_torn_lines_do_not_break_reading_or_the_learning_curve(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  path.write_text(_line(1) + TORN + '\n' + _line(2) + _line(2, 'eval', count=9.0)
                  + TORN)
  assert [(r['step'], r['split']) for r in logs.read_metrics(str(path))] == [
      (1, 'train'), (2, 'train'), (2, 'eval')]
  logs.plot_learning_curve(str(path), str(tmp_path / 'curve.png'))
  assert (tmp_path / 'curve.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def _curve_records():
  train = [{'step': st, 'split': 'train', 'loss': loss, 'accuracy': acc}
           for st, loss, acc in ((0, 10.0, 0.0), (500, 1.0, 0.5), (1000, 0.1, 1.0))]
  evals = [{'step': st, 'split': 'eval', 'loss': loss, 'accuracy': acc}
           for st, loss, acc in ((200, 10 ** 0.4, 0.4), (600, 10 ** -0.6, 0.8))]
  return train + evals


def test_learning_curve_puts_each_evaluation_where_its_axes_say(tmp_path):
  """Each panel's plot area is x 56..486 (left) or 556..986 (right), y 30..360 of the 1000 x 400
  PNG; steps 0..1000 span it, loss 0.1..10 (log) and accuracy 0..1 too. So eval loss 10**0.4 at
  step 200 is at (142, 129) and 10**-0.6 at step 600 at (314, 294); eval top-1 0.4 and 0.8 at
  (642, 228) and (814, 96)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax.run import curve  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'metrics.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in _curve_records()))
  logs.plot_learning_curve(str(path), str(tmp_path / 'curve.png'))
  image = Image.open(tmp_path / 'curve.png').convert('RGB')
  assert image.size == (1000, 400)

  def near(xy, color):
    return all(abs(a - b) <= 40 for a, b in zip(image.getpixel(xy), color))

  for xy in ((142, 129), (314, 294)):
    assert near(xy, curve.ORANGE), (xy, image.getpixel(xy))  # eval loss markers
  for xy in ((642, 228), (814, 96)):
    assert near(xy, curve.BLUE), (xy, image.getpixel(xy))  # eval top-1 markers
  assert near((271, 195), curve.BLUE)  # the train loss line through (500, 1.0)
  assert near((30, 200), (255, 255, 255)) and near((700, 380), (255, 255, 255))  # margins


def test_learning_curve_ticks_and_legend():
  import math  # pylint: disable=g-import-not-at-top
  from vit_jax.run import curve  # pylint: disable=g-import-not-at-top
  assert curve.nice_ticks(0, 3600, integer=True) == [0, 1000, 2000, 3000, 4000]
  assert curve.nice_ticks(0.22, 0.995) == [0.2, 0.4, 0.6, 0.8, 1.0]
  assert curve.nice_ticks(3, 3, integer=True) == [2, 3, 4]  # one step: a range around it
  decades = curve.log_ticks(math.log10(0.003), math.log10(20))  # > 2 decades: powers of ten
  np.testing.assert_allclose(decades, [-3, -2, -1, 0, 1, 2])
  fine = curve.log_ticks(math.log10(0.17), math.log10(2.14))
  np.testing.assert_allclose([10 ** t for t in fine], [0.1, 0.2, 0.5, 1, 2, 5])
  # The rising accuracy fills the top right corner: the legend goes to the bottom right.
  panel, series, _, _ = curve.panels(_curve_records())[1]
  assert curve.legend_box(panel, series) == (860, 312, 978, 352)
  # Non-finite losses, and zero on the log scale, are left out; an empty log draws empty axes.
  odd = [{'step': 1, 'split': 'train', 'loss': float('nan'), 'accuracy': 0.1},
         {'step': 2, 'split': 'train', 'loss': 0.0, 'accuracy': 0.1}]
  (loss, _, _, _), (accuracy, _, _, _) = curve.panels(odd)
  assert loss.x_range == loss.y_range == (0.0, 1.0)  # no loss to draw: the default axes
  assert accuracy.x_range == (1.0, 2.0)
  assert curve.render(odd).size == curve.render([]).size == (1000, 400)


@pytest.mark.slow
def test_runs_repair_the_log_on_a_fresh_start_and_on_resume(tmp_path, data_dir):
  """A kill -9 before the first checkpoint left records and a torn line: the fresh start empties
  the log; after a kill between checkpoints, the resume cuts it back to the checkpoint."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=4,batch_size=16')
  c.data_dir, c.warmup_steps, c.progress, c.log_every, c.checkpoint_every = data_dir, 1, False, 1, 2
  path = tmp_path / 'metrics.jsonl'
  path.write_text(_line(1) + _line(2) + _line(3) + TORN)
  loop.train_and_evaluate(c, str(tmp_path))
  records = logs.read_metrics(str(path))
  assert [(r['step'], r['split']) for r in records] == [(1, 'train'), (2, 'train'), (3, 'train'),
                                                        (4, 'train'), (4, 'eval')]
  assert 'skipped' in records[0] and path.read_text().endswith('\n')  # this run's records
  # As if killed after step 3 (checkpoint 2 is the newest): steps 3 and 4 are logged once.
  shutil.rmtree(tmp_path / 'checkpoints' / '4')
  with open(path, 'a') as f:
    f.write(TORN)
  loop.train_and_evaluate(c, str(tmp_path))
  assert [(r['step'], r['split']) for r in logs.read_metrics(str(path))] == [
      (1, 'train'), (2, 'train'), (3, 'train'), (4, 'train'), (4, 'eval')]
  assert TORN not in path.read_text()


@pytest.mark.parametrize('serial', [0, 9, 99])
def test_tensorboard_reads_the_scalars_written_without_tensorflow(tmp_path, monkeypatch, serial):
  """The event files (vit_jax/run/events.py) as TensorBoard's own reader sees them, in the order
  they were written whatever the process's count of writers so far (10 sorted before 9 once)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(events, '_SERIAL', itertools.count(serial))
  monkeypatch.setattr(events, 'time', types.SimpleNamespace(time=lambda: 1_795_000_000.5))  # 1 s
  logger = logs.MetricLogger(str(tmp_path), enabled=True)
  logger.write(1, 'train', {'loss': 2.5, 'accuracy': 0.125})
  logger.write(2, 'train', {'loss': 2.0, 'accuracy': 0.25})
  logger.write(2, 'eval', {'loss': 1.75, 'accuracy': 0.5})
  logger.close()
  second = logs.MetricLogger(str(tmp_path), enabled=True)  # a resumed run: a file of its own
  second.write(3, 'train', {'loss': 1.5, 'accuracy': 0.75})
  second.close()
  assert len(os.listdir(tmp_path / 'tensorboard')) == 2
  reader = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'))
  reader.Reload()
  assert sorted(reader.Tags()['scalars']) == ['eval/accuracy', 'eval/loss', 'train/accuracy',
                                              'train/loss']
  assert [(e.step, e.value) for e in reader.Scalars('train/loss')] == [(1, 2.5), (2, 2.0),
                                                                       (3, 1.5)]
  assert [(e.step, e.value) for e in reader.Scalars('eval/accuracy')] == [(2, 0.5)]
