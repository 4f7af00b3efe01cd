"""The predict function as serialized StableHLO (`jax.export`): BUNDLE/model.stablehlo.

The file is an `Exported` with the params inside as constants and a symbolic batch dimension,
lowered for CPU, CUDA and TPU: `jax.export.deserialize(bytearray(open(path, 'rb').read()))`
gives it back, and `.call(images)` runs it with jax alone (no flax, no vit_jax). `images` uint8
[batch, S, S, C] -> (probabilities, logits), as `vit_jax.serving.exported.predict_fn`.
"""

from vit_jax.formats import files
from vit_jax.serving import exported
from vit_jax.serving.bundle import Bundle

FILENAME = 'model.stablehlo'


def serialize(bundle: Bundle) -> bytes:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  predict = exported.predict_fn(bundle)
  params = jax.tree.map(np.asarray, bundle.params)
  batch, = jax.export.symbolic_shape('batch')
  images = jax.ShapeDtypeStruct((batch,) + exported.input_shape(bundle), np.uint8)
  fn = jax.jit(lambda x: predict(params, x))
  return jax.export.export(fn, platforms=exported.PLATFORMS)(images).serialize()


def load_and_run(path: str, images):
  """(probabilities, logits) of the export in `path` for `images`."""
  import jax  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    return jax.export.deserialize(bytearray(f.read())).call(images)


def save(bundle: Bundle, path: str) -> float:
  """Writes the export to `path` (atomically), runs it from the file; returns its relative logit
  error (`exported.check`)."""
  data = serialize(bundle)
  files.atomic_write(path, lambda f: f.write(data))
  return exported.check(bundle, lambda x: load_and_run(path, x)[1], f'the StableHLO export {path}')


__all__ = ['FILENAME', 'load_and_run', 'save', 'serialize']
