"""A TensorFlow SavedModel of a bundle's predict function (jax2tf), for TF Serving and any
TensorFlow program: `python -m vit_jax export` writes it to BUNDLE/saved_model.

Signature `serving_default`: `images`, uint8 [batch, S, S, C] (any batch; S and C the model's
input size and channels, images already resized / cropped as the bundle's model.json says) ->
`probabilities` float32 [batch, classes] (softmax, or the per-class sigmoid of a sigmoid_xent
model) and `logits`. Pixels are scaled to [-1, 1] inside, as the eval pipeline does. The params are
TF variables; the computation is the model's StableHLO (jax2tf native serialization), lowered for
CPU, CUDA and TPU. Loading it needs TensorFlow only (tf.saved_model.load), not JAX or this code.
"""

import os
import shutil

import numpy as np

from vit_jax.errors import UserError
from vit_jax.serving import exported
from vit_jax.serving.bundle import Bundle

DIRNAME = 'saved_model'


def save(bundle: Bundle, out: str) -> float:
  """Writes the SavedModel directory `out` (an existing one is replaced once the new one is
  complete and gives the JAX model's logits); returns its relative logit error
  (`exported.check`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top
  spec = bundle.spec
  shape = (spec.image_size, spec.image_size, spec.channels)
  converted = jax2tf.convert(
      exported.predict_fn(bundle), polymorphic_shapes=[None, f'(b, {", ".join(map(str, shape))})'],
      with_gradient=False, native_serialization_platforms=exported.PLATFORMS)
  module = tf.Module()
  module.params = tf.nest.map_structure(lambda v: tf.Variable(np.asarray(v), trainable=False),
                                        bundle.params)

  @tf.function(autograph=False,
               input_signature=[tf.TensorSpec((None,) + shape, tf.uint8, name='images')])
  def serve(images):
    probabilities, logits = converted(module.params, images)
    return {'probabilities': probabilities, 'logits': logits}

  module.serve = serve
  tmp = f'{out}.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    tf.saved_model.save(module, tmp, signatures={'serving_default': serve})
  except Exception as e:  # pylint: disable=broad-except  # conversion or writing failed
    shutil.rmtree(tmp, ignore_errors=True)
    raise UserError(f'cannot write the SavedModel {out} ({type(e).__name__}: '
                    f'{" ".join(str(e).split())[:200]}): export another format instead (--format=stablehlo or --format=onnx)')
  try:
    serve = tf.saved_model.load(tmp).signatures['serving_default']
    error = exported.check(bundle, lambda x: serve(images=tf.constant(x))['logits'].numpy(),
                           f'the SavedModel {out}')
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if os.path.exists(out):
    shutil.rmtree(out)
  os.replace(tmp, out)
  return error


__all__ = ['DIRNAME', 'save']
