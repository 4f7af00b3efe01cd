"""The export formats by name (`python -m vit_jax export --format=...`): where each is written in
the bundle directory and what it serves. Importing this module imports no framework, so a wrong
name is refused before anything is loaded.
"""

import dataclasses
import importlib
import os
from typing import Dict, Sequence, Tuple

from vit_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Format:
  filename: str  # in the bundle directory
  module: str  # its `save(bundle, path) -> relative logit error`
  serves: str  # what the user loads it with; {shape} is the image shape


FORMATS: Dict[str, Format] = {
    'savedmodel': Format('saved_model', 'vit_jax.serving.saved_model',
                         'TensorFlow SavedModel, serving_default: images uint8 {shape} -> '
                         'probabilities'),
    'stablehlo': Format('model.stablehlo', 'vit_jax.serving.stablehlo',
                        'StableHLO for jax.export.deserialize: images uint8 {shape} -> '
                        '(probabilities, logits)'),
    'onnx': Format('model.onnx', 'vit_jax.serving.onnx',
                   'ONNX (opset 23): images uint8 {shape} -> probabilities, logits'),
}
DEFAULT = ('savedmodel',)


def check(names: Sequence[str]) -> Tuple[str, ...]:
  """The format names, each once, in the order given; an unknown one is a UserError."""
  unknown = [n for n in names if n not in FORMATS]
  if unknown:
    raise UserError(f'--format={",".join(unknown)} is not an export format: use '
                    f'{" or ".join(FORMATS)}, comma-separated for several (or --format= for the '
                    'bundle only)')
  return tuple(dict.fromkeys(names))


def write(bundle, name: str, out: str) -> Tuple[str, float]:
  """Writes format `name` of `bundle` into the bundle directory `out`; (its path, its relative
  logit error against the JAX model, checked before it counts as written). A FlexiViT is written
  at its patch size as the plain ViT it is there (`exported.served`)."""
  from vit_jax.serving import exported  # pylint: disable=g-import-not-at-top  # JAX
  fmt = FORMATS[name]
  path = os.path.join(out, fmt.filename)
  return path, importlib.import_module(fmt.module).save(exported.served(bundle), path)


def describe(bundle, name: str) -> str:
  spec = bundle.spec
  shape = f'[batch, {spec.image_size}, {spec.image_size}, {spec.channels}]'
  return FORMATS[name].serves.format(shape=shape)


__all__ = ['DEFAULT', 'FORMATS', 'Format', 'check', 'describe', 'write']
