"""Top-5 classes of image files: `python -m vit_jax predict --workdir=DIR img1 img2 ...`.

The model is a training run (--workdir, optionally --checkpoint=STEP), an exported bundle
(--bundle), or a params file (--checkpoint=FILE.npz --model=ViT-B/16; see
vit_jax/commands/flag_groups.py).
Images are preprocessed like the model's eval images and run in batches of --batch_size. Prints,
per image, its path and the --top_k classes with probabilities; --json prints one JSON document
(a list of {"file", "top": [{"class", "index", "probability"}]}).
"""

import json
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups
from vit_jax.data import image_files

_SOURCE = flag_groups.model_source()
_BATCH_SIZE = flag_groups.batch_size()
_TOP_K = flags.DEFINE_integer('top_k', 5, 'Classes shown per image.')
_JSON = flag_groups.json_output()


def run(argv) -> int:
  paths = argv[1:]
  if not paths:
    raise cli.UserError('no images given: pass image files, e.g. python -m vit_jax predict '
                        '--workdir=DIR img1.jpg img2.png')
  _SOURCE.check()
  image_files.check_all_openable(paths)
  from vit_jax.serving import inference  # pylint: disable=g-import-not-at-top
  bundle = _SOURCE.resolve()
  note = bundle.source.get('class_names', '')
  if note.startswith('class indices'):
    print(f'note: classes shown as {note}', file=sys.stderr)
  results = inference.predict(bundle, paths, batch_size=_BATCH_SIZE.value, top_k=_TOP_K.value)
  print(json.dumps(results, indent=1) if _JSON.value else inference.format_text(results))
  return 0


def main():
  flag_groups.adapt_model_source()
  flag_groups.adapt('batch_size', default=32)
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
