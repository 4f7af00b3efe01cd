"""Scores a checkpoint on a list of evaluators and writes its results table:
`python -m vit_jax evaluate --workdir=RUN [--step=N] --evals=knn,linear_probe,fewshot`, or
`--weights=NAME --dataset=D --workdir=OUT` for released weights (or a params file with --model).
`--patch_size=P` runs a FlexiViT (model.flexi_patch set) at patch size P from the same params.

--evals names entries of the run's config.evals, registered evaluator types or suites
(docs/evaluation.md); --option=NAME.OPTION=VALUE sets an option of one, e.g. `--evals=vtab
--option=vtab.tasks=dtd+svhn` fine-tunes on two VTAB-1k tasks. The table (results.json,
results.md, results.png) goes to WORKDIR/evaluations/step_N/ and the features to
WORKDIR/features/; a rerun skips what they hold.
"""

import os
import signal
import sys

from absl import flags

from vit_jax import cli
from vit_jax import registry as shared_registry
from vit_jax.checkpoint import steps
from vit_jax.commands import flag_groups
from vit_jax.evaluate import registry  # the names and options are checked before jax loads

_WORKDIR = flag_groups.workdir()
_STEP = flags.DEFINE_string('step', None, 'Checkpoint step; default: the newest readable one.')
_EVALS = flags.DEFINE_list('evals', [], 'Evaluators: config.evals entries, registered '
                           'types or suites (docs/evaluation.md).')
_WEIGHTS = flags.DEFINE_string('weights', None, 'Released weights by name (python -m vit_jax '
                               'weights), or a params .npz with --model, instead of a run.')
_MODEL = flag_groups.model()
_DATASET = flag_groups.dataset()
_BATCH_SIZE = flag_groups.batch_size()
_DATA_DIR = flag_groups.data_dir()
_PATCH_SIZE = flag_groups.patch_size()
_IMAGE_SIZE = flag_groups.image_size()
_OPTION = flags.DEFINE_multi_string(
    'option', [], 'NAME.OPTION=VALUE: an option of an evaluator --evals runs, e.g. '
    'vtab.tasks=dtd+svhn (repeat the flag for more; VALUE a Python literal or a string).')


def _interrupt_on_sigterm() -> None:
  """SIGTERM stops the command as a Ctrl-C does (finished work kept, one line)."""

  def handler(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, handler)


def _refuse_unknown(names, step) -> None:
  """A missing or empty run, and a name that is none of its config's evaluator entries (nor a
  type or a suite), said before the heavy imports: the entries are read from the stored config
  of the steps the command may read (with --weights: the schema's default entries)."""
  if _WEIGHTS.value:
    from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
    from vit_jax.formats import weights  # pylint: disable=g-import-not-at-top
    if not weights.is_name(_WEIGHTS.value) and not os.path.isfile(_WEIGHTS.value):
      raise weights.unknown_source(_WEIGHTS.value)
    entries = set(common.base_config().evals)
  else:
    steps.resolve_checkpoint(_WORKDIR.value, step)
    entries = steps.evals_entries(_WORKDIR.value, step)
  if entries is not None:
    registry.refuse_unknown(names, entries)


def parse_options(given) -> dict:
  """['vtab.tasks=dtd+svhn', ...] -> {'vtab': {'tasks': 'dtd+svhn'}}; values read as Python
  literals where they are one, else kept as strings."""
  out = {}
  for text in given:
    target, eq, raw = text.partition('=')
    name, dot, key = target.partition('.')
    if not (eq and dot and name and key):
      raise cli.UserError(f'--option={text} is not NAME.OPTION=VALUE: e.g. '
                          f'--option=vtab.tasks=dtd+svhn')
    out.setdefault(name, {})[key] = shared_registry.option_value(raw)
  return out


def run(argv) -> int:
  del argv
  if not _WORKDIR.value:
    raise cli.UserError('missing --workdir: pass --workdir=DIR of a training run (with --weights: '
                        'the directory the table goes to)')
  step = _STEP.value
  if step is not None and not step.isdigit():
    raise cli.UserError(f'--step={step} is not a step number: pass one of the run\'s checkpoint '
                        f'steps (ls {_WORKDIR.value}/checkpoints), or leave it out for the newest')
  if _IMAGE_SIZE.value and not _WEIGHTS.value:
    raise cli.UserError('--image_size is for --weights (a params file whose position embedding '
                        "does not give its image size, a FlexiViT's): a run's size is its config's")
  if _WEIGHTS.value and step is not None:
    raise cli.UserError('--step names a checkpoint of a run: leave it out with --weights')
  if _DATASET.value and not _WEIGHTS.value:
    raise cli.UserError('--dataset is for --weights: a run is scored on its own dataset (an '
                        "evaluator entry's dataset option names another)")
  names = [n for n in _EVALS.value if n]
  if not names:
    raise cli.UserError('--evals is empty: name evaluators, e.g. --evals=knn,linear_probe,fewshot')
  options = parse_options(_OPTION.value)
  # The flags first (the options of the registered evaluators named), then the run on disk.
  known = registry.resolve(None, names, options, known_only=True)
  _refuse_unknown(names, step)
  _interrupt_on_sigterm()
  from vit_jax.evaluate import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import results  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import trials  # pylint: disable=g-import-not-at-top  (vtab's runs)
  if _WEIGHTS.value:
    own_data_only = all(n in known or n in registry.SUITES for n in names) and all(
        registry.own_data(call) is not None for call, _ in known.values())
    model, params, config, identity = checkpoint.load_weights(
        _WEIGHTS.value, _MODEL.value, _DATASET.value, _IMAGE_SIZE.value,
        needs_dataset=not own_data_only)
  else:
    model, params, config, identity = checkpoint.load_run_checkpoint(_WORKDIR.value, step)
  if _PATCH_SIZE.value is not None:  # FlexiViT: its own table and feature cache per patch size
    from vit_jax.models import flexi  # pylint: disable=g-import-not-at-top
    model = flexi.at_patch_size(model, _PATCH_SIZE.value, config.image_size)
    identity = dict(identity, patch_size=_PATCH_SIZE.value)
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  say = lambda line: print(line, file=sys.stderr, flush=True)
  out = checkpoint.evaluate(model, params, config, identity, names, workdir=_WORKDIR.value,
                            batch_size=_BATCH_SIZE.value, say=say, options=options,
                            train=trials.run_trials)
  print(results.markdown(out['checkpoint'], out['results']))
  say(f'wrote {out["directory"]}/results.json, results.md, results.png')
  return 0


def main():
  flag_groups.adapt('batch_size', help='Images per forward pass (all devices); default: the '
                    "run's eval_batch_size.")
  flag_groups.adapt('dataset', help='Dataset the evaluators read with --weights.')
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
