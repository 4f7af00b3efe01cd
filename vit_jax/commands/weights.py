"""Official pre-trained weights by name: `python -m vit_jax weights [--fetch=NAME]`.

Lists the known names (e.g. ViT-B/16@imagenet21k, ViT-L/16@imagenet21k+imagenet2012,
ViT-B/16@augreg-i21k), their bucket files and whether they are in the local cache; --fetch=NAME
downloads one now (otherwise the first command that names it does). Anywhere a checkpoint is
accepted (--config.init=, predict/export/convert/analyze --checkpoint=) such a name works. The
cache is $VIT_JAX_WEIGHTS_DIR (default ~/.cache/vit_jax/weights), the source $VIT_JAX_WEIGHTS_URL
(default https://storage.googleapis.com/vit_models; file:///path for a local mirror). Details:
vit_jax/formats/weights.py.
"""

import sys

from absl import flags

from vit_jax import cli

_FETCH = flags.DEFINE_string('fetch', None, 'Download the weights of this name into the cache.')


def run(argv) -> int:
  from vit_jax.formats import weights  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise cli.UserError(f'unexpected arguments {" ".join(argv[1:])}: weights takes only flags')
  if _FETCH.value:
    print(f'{_FETCH.value}: {weights.fetch(_FETCH.value)}')
  else:
    print(weights.listing())
  return 0


def main():
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
