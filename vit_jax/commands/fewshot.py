"""Few-shot linear evaluation of a checkpoint: `python -m vit_jax fewshot --workdir=DIR`.

Prints, for each n in --shots, the test accuracy of a closed-form regularised least-squares map
from the checkpoint's frozen pre-logit features of n training images per class onto {-1, 1}
targets (`evaluate_checkpoint` in vit_jax/evaluate/fewshot.py). The model and its eval
preprocessing come from the config stored with the checkpoint, the params are its Polyak average
when the run kept one (as the run's own evaluations); --dataset defaults to the run's dataset.
"""

import sys

from absl import flags

from vit_jax import cli
from vit_jax.checkpoint import steps
from vit_jax.commands import flag_groups

_WORKDIR = flag_groups.workdir()
_CHECKPOINT = flag_groups.checkpoint()
_DATASET = flag_groups.dataset()
_TRAIN_SPLIT = flags.DEFINE_string('train_split', 'train', 'Split the n-shot images come from.')
_EVAL_SPLIT = flags.DEFINE_string('eval_split', 'test', 'Split the classifiers are scored on.')
_SHOTS = flags.DEFINE_list('shots', ['1', '5', '10', '25'], 'Training images per class.')
_L2_REG = flags.DEFINE_float('l2_reg', 1.0, 'Ridge penalty of the least squares.')
_BATCH_SIZE = flag_groups.batch_size()
_DATA_DIR = flag_groups.data_dir()


def run(argv) -> int:
  del argv
  try:
    shots = [int(n) for n in _SHOTS.value]
  except ValueError:
    raise cli.UserError(f'--shots={",".join(_SHOTS.value)} must be integers, e.g. '
                        f'--shots=1,5,10,25') from None
  step_dir = steps.resolve_checkpoint(_WORKDIR.value, _CHECKPOINT.value)  # before jax loads
  from vit_jax.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  dataset, num_classes, accuracies = fewshot.evaluate_checkpoint(
      step_dir, dataset=_DATASET.value,
      data_dir=_DATA_DIR.value, train_split=_TRAIN_SPLIT.value, eval_split=_EVAL_SPLIT.value,
      shots=shots, l2_reg=_L2_REG.value, batch_size=_BATCH_SIZE.value)
  for name, accuracy in accuracies.items():
    print(f'{dataset} {name[:-len("shot")]}-shot top-1: {accuracy:.4f} '
          f'({num_classes} classes, {_EVAL_SPLIT.value})')
  return 0


def main():
  flag_groups.adapt('batch_size', default=256, help='Images per forward pass (all devices).')
  flag_groups.adapt('dataset', help="Dataset; default: the run's dataset.")
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
