"""Time and size of each deployment format `export` writes (vit_jax/serving/formats.py).

  PYTHONPATH=. .venv/bin/python benchmarks/export.py --model=ViT-B/16 --image_size=224 \
      --format=savedmodel

A model with random params (every one moved off its init, so the zero-initialised head gives
non-zero logits for the check; the times do not depend on the values) is exported to a temporary
directory; prints the seconds to write the format and check its logits against the JAX model's
(as `export` does), its size, and the seconds a batch of 8 takes through it.
"""

import argparse
import os
import tempfile
import time

import jax
import numpy as np

from vit_jax.models.spec import ModelSpec
from vit_jax.serving import exported
from vit_jax.serving import formats
from vit_jax.serving.bundle import Bundle


def _size(path: str) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _runner(name: str, path: str):
  """images -> logits through the written file, as its users load it."""
  if name == 'savedmodel':
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    serve = tf.saved_model.load(path).signatures['serving_default']
    return lambda x: serve(images=tf.constant(x))['logits'].numpy()
  if name == 'stablehlo':
    with open(path, 'rb') as f:
      call = jax.export.deserialize(bytearray(f.read())).call
    return lambda x: np.asarray(call(x)[1])
  from vit_jax.serving import onnx  # pylint: disable=g-import-not-at-top
  runtime = onnx.runtime(path)
  return lambda x: runtime.run(['logits'], {'images': x})[0]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model', default='ViT-B/16')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--classes', type=int, default=1000)
  parser.add_argument('--format', default='savedmodel', choices=sorted(formats.FORMATS))
  args = parser.parse_args()
  spec = ModelSpec(args.model, args.classes, {}, args.image_size, 3)
  model = spec.build()
  x = np.zeros((1, args.image_size, args.image_size, 3), np.float32)
  params = jax.jit(lambda k: model.init(k, x, train=False))(jax.random.key(0))['params']
  rng = np.random.RandomState(0)
  params = jax.tree.map(lambda p: np.asarray(p) + rng.normal(0, .02, p.shape).astype(p.dtype),
                        params)
  bundle = Bundle(spec=spec, params=params,
                  class_names=tuple(map(str, range(args.classes))))
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    path, error = formats.write(bundle, args.format, tmp)
    write_s = time.perf_counter() - start
    run = _runner(args.format, path)
    images = exported.check_images(bundle, 8)
    run(images)  # the first call compiles or plans
    start = time.perf_counter()
    run(images)
    run_s = time.perf_counter() - start
    size = _size(path)
  print(f'{args.model} at {args.image_size} px, {args.format}: written and checked in '
        f'{write_s:.1f} s (relative logit error {error:.1e}), {size / 2**20:.0f} MiB, '
        f'batch of 8 in {run_s:.2f} s')


if __name__ == '__main__':
  main()
