"""Figures of what a trained ViT learned: `python -m vit_jax analyze --workdir=DIR --out=OUT`.

Writes to OUT: embedding_filters, posemb_similarity, attention_distance, attention_rollout (each a
.png and the .npz of its arrays) and summary.json. Positional arguments are PNG/JPEG files for the
attention figures (resized to the model's input size and channels); without them the first
--num_images eval images of the run's dataset are used. --checkpoint is a step number or a step
directory (by default the newest step in the workdir), or, with image files, an .npz params file
(--model=VARIANT) or official weights by name (--checkpoint=ViT-B/16@imagenet21k+imagenet2012).
A run's model and preprocessing come from the config stored with its checkpoint; --image_size runs
the model at another resolution (the position embedding resized as `config.init` resizes it).
"""

import os
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups
from vit_jax.data import image_files
from vit_jax.serving import paths

_WORKDIR = flag_groups.workdir()
_CHECKPOINT = flag_groups.checkpoint()
_OUT = flag_groups.out()
_NUM_IMAGES = flags.DEFINE_integer('num_images', 16, 'Eval images used without image arguments.')
_DATA_DIR = flag_groups.data_dir()
_IMAGE_SIZE = flag_groups.image_size()
_MODEL = flag_groups.model()


def run(argv) -> int:
  if _OUT.value:  # a missing run, step or params file, before jax (no --out: the report says so)
    paths.check(workdir=_WORKDIR.value, checkpoint=_CHECKPOINT.value, bundle=None,
                params_options=bool(_MODEL.value))
  for path in argv[1:]:  # as the figures read them: the first file that cannot be read is said
    image_files.check_openable(path)
  from vit_jax.analysis import report  # pylint: disable=g-import-not-at-top
  summary = report.write_report(workdir=_WORKDIR.value, out=_OUT.value,
                                checkpoint=_CHECKPOINT.value, images=argv[1:],
                                num_images=_NUM_IMAGES.value, data_dir=_DATA_DIR.value,
                                image_size=_IMAGE_SIZE.value, model=_MODEL.value)
  for name, info in summary['figures'].items():
    where = os.path.join(_OUT.value, info['png']) if 'png' in info else None
    print(f'{name}: {where or "skipped (" + info["skipped"] + ")"}')
  return 0


def main():
  flag_groups.adapt('out', help='Directory for the PNG figures and .npz arrays.')
  flag_groups.adapt('checkpoint', help='Step number or step directory of --workdir; or an .npz '
                    'params file (with --model) or official weights by name, with image files.')
  flag_groups.adapt('image_size', help="Run the model at this input size (position embedding "
                    "resized as config.init does); default: the run's.")
  cli.run_main(run, required_flags=('out',))


if __name__ == '__main__':
  sys.exit(main())
