"""The predict function as an ONNX model: BUNDLE/model.onnx, for onnxruntime and any ONNX runtime.

Converted from the JAX function by jax2onnx (it translates the traced JAX program op by op, so
it needs neither TensorFlow nor a SavedModel in between), opset 23, params as initializers, the
batch dimension symbolic: input `images` uint8 [batch, S, S, C] -> outputs `probabilities` and
`logits` float32 [batch, classes], as `vit_jax.serving.exported.predict_fn`. ONNX files hold at
most 2 GB (protobuf), so models above about 500M float32 params do not fit.
"""

import logging

from vit_jax.errors import UserError
from vit_jax.formats import files
from vit_jax.serving import exported
from vit_jax.serving.bundle import Bundle

FILENAME = 'model.onnx'
OPSET = 23


def convert(bundle: Bundle):
  """The onnx.ModelProto of the bundle's predict function."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  # jax2onnx imports its example plugins too; those that need packages not installed here log a
  # warning with a traceback each. They are not used.
  logging.getLogger('jax2onnx').setLevel(logging.ERROR)
  from jax2onnx import to_onnx  # pylint: disable=g-import-not-at-top
  predict = exported.predict_fn(bundle)
  params = jax.tree.map(np.asarray, bundle.params)
  shape = jax.export.symbolic_shape('batch,' + ','.join(map(str, exported.input_shape(bundle))))
  return to_onnx(lambda x: predict(params, x), [jax.ShapeDtypeStruct(shape, np.uint8)],
                 model_name=bundle.spec.model_name, opset=OPSET, input_names=['images'],
                 output_names=['probabilities', 'logits'])


def runtime(path: str):
  """An onnxruntime inference of the model in `path`, on the CPU."""
  import onnxruntime  # pylint: disable=g-import-not-at-top
  return onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])


def save(bundle: Bundle, path: str) -> float:
  """Writes the ONNX model to `path` (atomically), runs it in onnxruntime; returns its relative
  logit error (`exported.check`)."""
  try:
    data = convert(bundle).SerializeToString()
  except ValueError as e:  # protobuf refuses messages over 2 GB
    if 'exceeds maximum protobuf size' not in str(e):
      raise
    raise UserError(f'{bundle.spec.model_name} is too large for one ONNX file (2 GB at most): '
                    'export --format=stablehlo or savedmodel') from None
  files.atomic_write(path, lambda f: f.write(data))
  return exported.check(bundle, lambda x: runtime(path).run(['logits'], {'images': x})[0],
                        f'the ONNX export {path}')


__all__ = ['FILENAME', 'OPSET', 'convert', 'runtime', 'save']
