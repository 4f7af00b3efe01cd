"""Time and size of the TensorFlow SavedModel `export` writes (vit_jax/serving/saved_model.py).

  PYTHONPATH=. .venv/bin/python benchmarks/saved_model_export.py --model=ViT-B/16 --image_size=224

A randomly initialised model (the figures do not depend on the values) is exported to a temporary
directory; prints the seconds to write it, its size and the seconds TensorFlow takes to load it.
"""

import argparse
import os
import tempfile
import time

import jax
import numpy as np

from vit_jax.models.spec import ModelSpec
from vit_jax.serving import saved_model
from vit_jax.serving.bundle import Bundle


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model', default='ViT-B/16')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--classes', type=int, default=1000)
  args = parser.parse_args()
  spec = ModelSpec(args.model, args.classes, {}, args.image_size, 3)
  model = spec.build()
  x = np.zeros((1, args.image_size, args.image_size, 3), np.float32)
  params = jax.jit(lambda k: model.init(k, x, train=False))(jax.random.key(0))['params']
  bundle = Bundle(spec=spec, params=jax.tree.map(np.asarray, params),
                  class_names=tuple(map(str, range(args.classes))))
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'saved_model')
    start = time.perf_counter()
    saved_model.save(bundle, out)
    write_s = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    start = time.perf_counter()
    tf.saved_model.load(out)
    load_s = time.perf_counter() - start
  print(f'{args.model} at {args.image_size} px: written in {write_s:.1f} s, {size / 2**20:.0f} MiB,'
        f' loaded by TensorFlow in {load_s:.1f} s')


if __name__ == '__main__':
  main()
