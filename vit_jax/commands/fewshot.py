"""Few-shot linear evaluation of a checkpoint: `python -m vit_jax.fewshot --workdir=DIR`.

Prints, for each n in --shots, the test accuracy of a closed-form regularised least-squares map
from the checkpoint's frozen pre-logit features of n training images per class onto {-1, 1}
targets (vit_jax/evaluate/fewshot.py). The model and its eval preprocessing come from the config
stored with the checkpoint, the params are its Polyak average when the run kept one (as the run's
own evaluations); --dataset defaults to the run's dataset.
"""

import sys

from absl import flags

from vit_jax import cli

_WORKDIR = flags.DEFINE_string('workdir', None, 'Training run directory (holds checkpoints/).')
_CHECKPOINT = flags.DEFINE_string('checkpoint', None,
                                  'Step number or checkpoint step directory; default: newest.')
_DATASET = flags.DEFINE_string('dataset', None, "tfds dataset; default: the run's dataset.")
_TRAIN_SPLIT = flags.DEFINE_string('train_split', 'train', 'Split the n-shot images come from.')
_EVAL_SPLIT = flags.DEFINE_string('eval_split', 'test', 'Split the classifiers are scored on.')
_SHOTS = flags.DEFINE_list('shots', ['1', '5', '10', '25'], 'Training images per class.')
_L2_REG = flags.DEFINE_float('l2_reg', 1.0, 'Ridge penalty of the least squares.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Images per forward pass (all devices).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, "tfds data_dir; default: the run's config.")


def run(argv) -> int:
  del argv
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import FewShotEvaluator  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top
  try:
    shots = [int(n) for n in _SHOTS.value]
  except ValueError:
    raise cli.UserError(f'--shots={",".join(_SHOTS.value)} must be integers, e.g. '
                        f'--shots=1,5,10,25') from None
  # The Polyak average when the run kept one: the params its own evaluations scored.
  model, params, config = inputs.load_model(
      inputs.resolve_checkpoint(_WORKDIR.value, _CHECKPOINT.value), averaged=True)
  mesh = parallel.make_mesh(ml_collections.ConfigDict({'data': -1}))
  if _BATCH_SIZE.value < 1 or _BATCH_SIZE.value % mesh.devices.size:
    raise cli.UserError(f'--batch_size={_BATCH_SIZE.value} does not split over '
                        f'{mesh.devices.size} devices: use a multiple of {mesh.devices.size}')
  dataset = _DATASET.value or config.dataset
  evaluator = FewShotEvaluator(
      model=model, mesh=mesh, param_shardings=sharding.replicated(mesh), dataset=dataset,
      data_dir=_DATA_DIR.value or config.data_dir, train_split=_TRAIN_SPLIT.value,
      eval_split=_EVAL_SPLIT.value, shots=shots, l2_reg=_L2_REG.value,
      batch_size=_BATCH_SIZE.value, cache=False,
      pp=program.eval_pp(config))
  for name, accuracy in evaluator(params).items():
    print(f'{dataset} {name[:-len("shot")]}-shot top-1: {accuracy:.4f} '
          f'({evaluator.num_classes} classes, {_EVAL_SPLIT.value})')
  return 0


def main():
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
