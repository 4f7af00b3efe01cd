"""What every export format runs, and the check each passes before `export` reports it written.

`predict_fn` is the exported computation: uint8 images [batch, S, S, C] (already resized and
cropped as the bundle's model.json says) -> (probabilities, logits), pixels scaled to [-1, 1]
inside as the eval pipeline does. `check` runs a written export on a batch of fixed random images
and compares its logits with the JAX model's: a difference above the tolerance is a one-line
UserError, so a broken export is never reported as written.
"""

import dataclasses
from typing import Any, Callable

import numpy as np

from vit_jax.errors import UserError
from vit_jax.serving.bundle import Bundle

PLATFORMS = ('cpu', 'cuda', 'tpu')  # what SavedModel and StableHLO exports are lowered for
CHECK_BATCH = 3  # images in the check; not the batch size of any trace, so it tests a free batch
# Max |export - JAX| over max |JAX logit|: float32 models differ by operation order only;
# bf16/fp16 compute rounds differently in another runtime.
TOLERANCE = 1e-4
LOW_PRECISION_TOLERANCE = 3e-2


def predict_fn(bundle: Bundle) -> Callable[[Any, Any], Any]:
  """(params, uint8 images) -> (probabilities, logits); probabilities are the softmax, or the
  per-class sigmoid of a sigmoid_xent model."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  model = bundle.spec.build()

  def predict(params, images):
    x = (images.astype(jnp.float32) - 127.5) / 127.5
    logits = model.apply({'params': params}, x, train=False).astype(jnp.float32)
    if bundle.output == 'sigmoid':
      return jax.nn.sigmoid(logits), logits
    return jax.nn.softmax(logits, axis=-1), logits
  return predict


def served(bundle: Bundle) -> Bundle:
  """The bundle as every export serves it: a FlexiViT as the plain ViT of its patch size
  (`flexi.fixed_patch`: its kernel and position embedding resized once, not in the program, which
  ONNX's resize could not always express), any other model as it is."""
  from vit_jax.models import flexi  # pylint: disable=g-import-not-at-top  # JAX
  model, params = flexi.fixed_patch(bundle.spec.build(), bundle.params, bundle.spec.image_size)
  if params is bundle.params:
    return bundle
  options = {**bundle.spec.options, 'flexi_patch': model.flexi_patch,
             'flexi_grid': model.flexi_grid}
  return dataclasses.replace(bundle, spec=dataclasses.replace(bundle.spec, options=options),
                             params=params)


def input_shape(bundle: Bundle):
  """(S, S, C): one image as the export takes it."""
  spec = bundle.spec
  return (spec.image_size, spec.image_size, spec.channels)


def check_images(bundle: Bundle, batch: int = CHECK_BATCH) -> np.ndarray:
  """Fixed random uint8 images [batch, S, S, C]."""
  return np.random.RandomState(0).randint(0, 256, (batch,) + input_shape(bundle), np.uint8)


def relative_error(got, want) -> float:
  """max |got - want| / max |want|."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return float('inf')
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def tolerance(bundle: Bundle) -> float:
  dtype = np.dtype(bundle.spec.variant().get('dtype') or np.float32)
  return TOLERANCE if dtype == np.float32 else LOW_PRECISION_TOLERANCE


def check(bundle: Bundle, run: Callable[[np.ndarray], Any], what: str) -> float:
  """Runs `run(images) -> logits` (a written export) on the check images; returns the relative
  error against the JAX model's logits, or raises a UserError above the tolerance."""
  import jax  # pylint: disable=g-import-not-at-top
  images = check_images(bundle)
  _, want = jax.jit(predict_fn(bundle))(bundle.params, images)
  try:
    got = run(images)
  except Exception as e:  # pylint: disable=broad-except  # the runtime refused the export
    raise UserError(f'{what} does not run ({type(e).__name__}: {" ".join(str(e).split())[:200]})'
                    ': export another --format, or report it with the model name') from None
  error = relative_error(got, want)
  if not error <= tolerance(bundle):
    raise UserError(f'{what} gives other logits than the JAX model (relative error {error:.2g} > '
                    f'{tolerance(bundle):g}): export another --format, or report it with the '
                    'model name')
  return error


__all__ = ['CHECK_BATCH', 'PLATFORMS', 'check', 'check_images', 'input_shape', 'predict_fn',
           'relative_error', 'served', 'tolerance']
