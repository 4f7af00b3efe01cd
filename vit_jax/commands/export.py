"""Inference bundle of a model: `python -m vit_jax export --workdir=DIR --out=BUNDLE`.

Writes BUNDLE/params.npz (the released .npz layout) and BUNDLE/model.json (model name, options,
resolution, channels, class names, eval preprocessing); `python -m vit_jax predict --bundle=BUNDLE`
then needs neither the workdir nor its dataset. Sources as for predict
(vit_jax/commands/flag_groups.py): --workdir [--checkpoint=STEP], --bundle, or --checkpoint=FILE
--model=NAME.
"""

import sys

from vit_jax import cli
from vit_jax.commands import flag_groups

_SOURCE = flag_groups.model_source()
_OUT = flag_groups.out()


def run(argv) -> int:
  from vit_jax.serving import bundle as bundle_lib  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise cli.UserError(f'unexpected arguments {" ".join(argv[1:])}: export takes only flags')
  bundle = _SOURCE.resolve()
  bundle_lib.save(bundle, _OUT.value)
  spec = bundle.spec
  print(f'wrote {_OUT.value}: {spec.model_name}, {spec.num_classes} classes, '
        f'{spec.image_size}x{spec.image_size}x{spec.channels}')
  return 0


def main():
  flag_groups.adapt_model_source()
  flag_groups.adapt('out', help='Bundle directory to write.')
  cli.run_main(run, required_flags=('out',))


if __name__ == '__main__':
  sys.exit(main())
