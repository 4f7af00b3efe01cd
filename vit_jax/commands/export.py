"""Inference bundle of a model: `python -m vit_jax export --workdir=DIR --out=BUNDLE`.

Writes BUNDLE/params.npz (the released .npz layout) and BUNDLE/model.json (model name, options,
resolution, channels, class names, eval preprocessing); `python -m vit_jax predict --bundle=BUNDLE`
then needs neither the workdir nor its dataset. BUNDLE/saved_model is the same predict function as
a TensorFlow SavedModel (vit_jax/serving/saved_model.py; --nosaved_model skips it). Sources as for predict
(vit_jax/commands/flag_groups.py): --workdir [--checkpoint=STEP], --bundle, or --checkpoint=FILE
--model=NAME.
"""

import os
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_SOURCE = flag_groups.model_source()
_OUT = flag_groups.out()
_SAVED_MODEL = flags.DEFINE_bool(
    'saved_model', True, 'Also write BUNDLE/saved_model, a TensorFlow SavedModel of the predict '
    'function (uint8 images in, probabilities out) for TF Serving.')


def run(argv) -> int:
  from vit_jax.serving import bundle as bundle_lib  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise cli.UserError(f'unexpected arguments {" ".join(argv[1:])}: export takes only flags')
  bundle = _SOURCE.resolve()
  bundle_lib.save(bundle, _OUT.value)
  spec = bundle.spec
  print(f'wrote {_OUT.value}: {spec.model_name}, {spec.num_classes} classes, '
        f'{spec.image_size}x{spec.image_size}x{spec.channels}')
  if _SAVED_MODEL.value:
    from vit_jax.serving import saved_model  # pylint: disable=g-import-not-at-top
    path = saved_model.save(bundle, os.path.join(_OUT.value, saved_model.DIRNAME))
    print(f'wrote {path}: TensorFlow SavedModel, serving_default: images uint8 '
          f'[batch, {spec.image_size}, {spec.image_size}, {spec.channels}] -> probabilities')
  return 0


def main():
  flag_groups.adapt_model_source()
  flag_groups.adapt('out', help='Bundle directory to write.')
  cli.run_main(run, required_flags=('out',))


if __name__ == '__main__':
  sys.exit(main())
