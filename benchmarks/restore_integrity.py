"""What checking a checkpoint against its manifest costs a restore (vit_jax/checkpoint/integrity.py).

Writes the train state of a model (params and Adam's two moments, random as after training, as
the trainer saves it) once into --workdir, then times `Checkpointer.restore_latest` with the check
(sizes and small files checked first, the array data's CRC-32 on a thread beside the read) and
with the check replaced by nothing (a step without a manifest is never restored), alternately, --pairs times, after one untimed
restore that brings the files into the page cache:

  PYTHONPATH=. .venv/bin/python benchmarks/restore_integrity.py --model=ViT-L/16 \
      --workdir=/tmp/restore_integrity

Prints one JSON line: the checkpoint's size, each restore's seconds, the median of each, and the
seconds of the whole verification alone (`integrity.damage`, one thread, files in the page cache).
"""

import argparse
import contextlib
import json
import os
import statistics
import time


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model', default='ViT-L/16')
  parser.add_argument('--workdir', default='/tmp/restore_integrity')
  parser.add_argument('--pairs', type=int, default=3)
  args = parser.parse_args()

  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.benchmarking import ours  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.benchmarking import processor  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoint import integrity, train_ckpt  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top

  config = mnist5k.get_config()
  ours.set_benchmark_values(config, args.model, batch_size=8, image_size=224, dtype='float32')
  prog = program.build_program(config, require_dataset=False)
  abstract = train_ckpt.abstract_with_shardings(prog.abstract_state, prog.state_shardings)
  step_dir = os.path.join(args.workdir, 'checkpoints', '1')
  if not os.path.isdir(step_dir):
    state = prog.init_state()
    # Adam's moments as a trained run's: orbax compresses the zeros of a fresh state to nothing.
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree_util.tree_leaves(state))))
    state = state.replace(opt_state=jax.tree.map(
        lambda x: (jax.random.normal(next(keys), x.shape, x.dtype) * 1e-3
                   if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) and x.ndim else x),
        state.opt_state))
    ckpt = train_ckpt.Checkpointer(args.workdir, keep=1)
    ckpt.save(1, state, config.to_dict())
    ckpt.close()
    del state
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(step_dir) for f in fs)

  def restore() -> float:
    start = time.perf_counter()
    ckpt = train_ckpt.Checkpointer(args.workdir, keep=1)
    step, state, _ = ckpt.restore_latest(abstract)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    assert step == 1
    ckpt.close()
    for leaf in jax.tree_util.tree_leaves(state):
      leaf.delete()
    return seconds

  restore()  # untimed: the files into the page cache
  times = {'checked': [], 'unchecked': []}
  for pair in range(args.pairs):
    for kind in (('checked', 'unchecked') if pair % 2 == 0 else ('unchecked', 'checked')):
      with _unchecked(integrity) if kind == 'unchecked' else contextlib.nullcontext():
        times[kind].append(restore())
  checksums = []  # the verification alone, on this thread: its CPU cost
  for _ in range(args.pairs):
    start = time.perf_counter()
    assert integrity.damage(step_dir) is None
    checksums.append(time.perf_counter() - start)
  print(json.dumps({
      'model': args.model, 'checkpoint_bytes': size, 'processor': processor.describe(),
      'checked_s': [round(t, 2) for t in times['checked']],
      'unchecked_s': [round(t, 2) for t in times['unchecked']],
      'checked_median_s': round(statistics.median(times['checked']), 2),
      'unchecked_median_s': round(statistics.median(times['unchecked']), 2),
      'verification_alone_s': [round(t, 2) for t in checksums]}))


class _NoVerification:
  """A `Verification` that checks nothing."""

  def __init__(self, step_dir):
    del step_dir

  def result(self):
    return None

  def cancel(self):
    pass


@contextlib.contextmanager
def _unchecked(integrity):
  """The restore with the integrity check replaced by nothing: what the check costs is the
  difference."""
  damage, verification = integrity.damage, integrity.Verification
  integrity.damage, integrity.Verification = (lambda *a, **k: None), _NoVerification
  try:
    yield
  finally:
    integrity.damage, integrity.Verification = damage, verification


if __name__ == '__main__':
  main()
