"""Inference bundle of a model: `python -m vit_jax export --workdir=DIR --out=BUNDLE`.

Writes BUNDLE/params.npz (the released .npz layout) and BUNDLE/model.json (model name, options,
resolution, channels, class names, eval preprocessing); `python -m vit_jax predict --bundle=BUNDLE`
then needs neither the workdir nor its dataset. `--format` adds the predict function in deployment
formats (vit_jax/serving/formats.py): savedmodel (BUNDLE/saved_model, the default), stablehlo
(BUNDLE/model.stablehlo), onnx (BUNDLE/model.onnx); each is run on a batch and its logits compared
with the JAX model's before it is reported written. Sources as for predict
(vit_jax/commands/flag_groups.py): --workdir [--checkpoint=STEP], --bundle, or --checkpoint=FILE
--model=NAME, or released weights by name.
"""

import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups
from vit_jax.serving import formats

_SOURCE = flag_groups.model_source()
_OUT = flag_groups.out()
_FORMAT = flags.DEFINE_list(
    'format', list(formats.DEFAULT), 'Deployment formats written into the bundle beside '
    f'params.npz, comma-separated: {", ".join(formats.FORMATS)} (empty: the bundle only).')


def run(argv) -> int:
  if len(argv) > 1:
    raise cli.UserError(f'unexpected arguments {" ".join(argv[1:])}: export takes only flags')
  names = formats.check(_FORMAT.value)
  _SOURCE.check()
  from vit_jax.serving import bundle as bundle_lib  # pylint: disable=g-import-not-at-top
  bundle = _SOURCE.resolve()
  bundle_lib.save(bundle, _OUT.value)
  spec = bundle.spec
  print(f'wrote {_OUT.value}: {spec.model_name}, {spec.num_classes} classes, '
        f'{spec.image_size}x{spec.image_size}x{spec.channels}')
  for name in names:
    path, error = formats.write(bundle, name, _OUT.value)
    print(f'wrote {path}: {formats.describe(bundle, name)} (logits checked: relative error '
          f'{error:.1e})')
  return 0


def main():
  flag_groups.adapt_model_source()
  flag_groups.adapt('out', help='Bundle directory to write.')
  cli.run_main(run, required_flags=('out',))


if __name__ == '__main__':
  sys.exit(main())
