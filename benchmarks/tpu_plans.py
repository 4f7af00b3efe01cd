"""Paper-scale plans by the TPU compiler: for each planned recipe, the cheapest memory setting
under which the train and eval steps fit the slice's HBM, with per-core peak and compile time.

  PYTHONPATH=. .venv/bin/python benchmarks/tpu_plans.py > plans.md          # every plan
  PYTHONPATH=. .venv/bin/python benchmarks/tpu_plans.py --only=pretrain:H/14 --search

Without --search each plan compiles once with the setting shipped in vit_jax/configs/recipes.py
(TPU_PLANS); with --search the settings of `LADDER` are tried in order (cheapest first) and the
first that fits is reported. Each line of the table is one `vit_jax.main` run of
`configs/<recipe>.py:model=M,...,plan=true` (compile-only for the planned slice; nothing is
trained or read). Needs the TPU compiler: `make tpu-compiler`.
"""

import argparse
import contextlib
import io
import json
import sys
import time

from vit_jax.platform import tf_import

# Memory settings, cheapest first: each step costs compute (remat), precision (bf16) or
# communication (FSDP). scan and attention stay as the plan or the recipe sets them.
LADDER = [
    {},
    {'model.remat': 'full'},
    {'model.remat': 'full', 'mesh.data': 1, 'mesh.fsdp': -1},
    {'model.remat': 'full', 'model.dtype': 'bfloat16'},
    {'model.remat': 'full', 'model.dtype': 'bfloat16', 'mesh.data': 1, 'mesh.fsdp': -1},
]


def plan_config(key, settings=None):
  """The recipe config of plan `key` = (recipe, model) with `settings` (default: the shipped)."""
  from vit_jax.configs import plans  # pylint: disable=g-import-not-at-top
  return plans.get_config(key, settings)


def compile_plan(key, settings):
  """(report or None if it does not fit, error line, wall seconds)."""
  from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  config = plan_config(key, settings)
  start = time.perf_counter()
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      report = loop.train_and_evaluate(config, '/nonexistent/plan')
    return report, '', time.perf_counter() - start
  except UserError as e:
    return None, str(e), time.perf_counter() - start


def describe(settings: dict) -> str:
  return ', '.join(f'{k}={v}' for k, v in settings.items()) or 'defaults'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default='', help='recipe:model[,recipe:model...]')
  parser.add_argument('--search', action='store_true', help='try LADDER instead of the plan')
  parser.add_argument('--json', default='', help='also append one JSON line per plan here')
  args = parser.parse_args()
  tf_import.import_quietly()
  from vit_jax.configs import recipes  # pylint: disable=g-import-not-at-top
  keys = ([tuple(k.split(':')) for k in args.only.split(',')] if args.only
          else list(recipes.TPU_PLANS))
  gib = 2 ** 30
  print('| recipe | model | px | global batch | slice | setting | per-core peak train / eval '
        '(GiB) | fits 16 GiB | TPU compile train + eval (s) |')
  print('|---|---|---|---|---|---|---|---|---|')
  for key in keys:
    plan = recipes.TPU_PLANS[key]
    ladder = ([dict(plan['settings'], **s) for s in LADDER] if args.search
              else [plan['settings']])
    for settings in ladder:
      report, error, seconds = compile_plan(key, settings)
      config = plan_config(key, settings)
      row = dict(recipe=key[0], model=key[1], image_size=config.image_size,
                 batch=config.batch_size, slice=plan['slice'], settings=settings,
                 wall_seconds=round(seconds, 1), error=error)
      if report is not None:
        row.update(peak_gib=round(report['peak_bytes'] / gib, 2),
                   eval_peak_gib=round(report['eval']['peak_bytes'] / gib, 2),
                   train_compile_s=round(report['compile_seconds'], 1),
                   eval_compile_s=round(report['eval']['compile_seconds'], 1))
        print(f'| {key[0]} | {key[1]} | {config.image_size} | {config.batch_size} | '
              f'{plan["slice"]} | {describe(settings)} | {row["peak_gib"]:.2f} / '
              f'{row["eval_peak_gib"]:.2f} | yes | {row["train_compile_s"]:.0f} + '
              f'{row["eval_compile_s"]:.0f} |', flush=True)
      else:
        print(f'| {key[0]} | {key[1]} | {config.image_size} | {config.batch_size} | '
              f'{plan["slice"]} | {describe(settings)} | - | no: {error[:80]} | - |', flush=True)
      if args.json:
        with open(args.json, 'a') as f:
          f.write(json.dumps(row) + '\n')
      if report is not None and args.search:
        break
  return 0


if __name__ == '__main__':
  sys.exit(main())
