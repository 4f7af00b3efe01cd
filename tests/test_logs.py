"""Metric logs go through tf.io.gfile: a bucket workdir (here TF's in-memory ram:// filesystem,
standing in for gs://) gets the same JSONL log, TensorBoard events and learning-curve PNG."""

import tensorflow as tf

from vit_jax.train import logs


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
