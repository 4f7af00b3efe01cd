"""The TPU compiler's estimated step time of the paper's recipes, per TPU generation and per setting.

  PYTHONPATH=. .venv/bin/python benchmarks/tpu_estimates.py --json=benchmarks/results/tpu_estimates.jsonl
  PYTHONPATH=. .venv/bin/python benchmarks/tpu_estimates.py --only=generations --models=B/16
  PYTHONPATH=. .venv/bin/python benchmarks/tpu_estimates.py --only=settings --small --depths=1,2

Each row compiles the train step of one plan (vit_jax/configs/plans.py: the recipe, compile-only
for a slice; nothing is trained or read) and prints the compiler's estimate of it
(`Program.estimate`: the cost model's `optimal_seconds`, a lower bound, with any Pallas calls
costed from the model's shapes), images/s per chip, utilisation of the chip's peak, and the
per-device peak memory. With --depths=2,4 the encoder is compiled at those two depths and the
figures extrapolated linearly to the model's depth (every block compiles to the same ops, and the
cost model sums a bound per op), which takes a fraction of the compile time. With --small each
row compiles the recipe's per-device batch on the generation's 8-slice (`SMALL`: v3-8, v4-8, v5p-8,
v6e-8) instead of the slice itself: with the batch split over the data axis alone, the cost model
gives a device of either the same figures (seconds, FLOPs and peak memory: benchmarks/RESULTS.md);
settings that shard the parameters over the slice (fsdp) still compile on the full slice, where
their shards and gathers are the slice's own.

  generations  the pre-training recipe (ViT paper, Table 3: batch 4096, 224 px) of each model on
               a slice of each generation (`GENERATIONS`)
  settings     the same recipe on the slice its plan names, with each setting a user can choose
               changed (`SETTINGS`, or names joined by '+': float32+attention=einsum), so the
               best that fits can be the default

Needs the TPU compiler: `make tpu-compiler`. Run one at a time: a compile of H/14 holds several GiB.
"""

import argparse
import contextlib
import io
import json
import sys
import time

from vit_jax.platform import tf_import

MODELS = ('B/16', 'L/16', 'H/14')
# The slice of each generation a 4096-image batch is compiled for: 16 images per core (v3),
# 32 per chip (v4, v5p) or 16 per chip (v6e); H/14 on twice as many devices (its plan's v3-512).
GENERATIONS = {'v3': 'v3-256', 'v4': 'v4-256', 'v5p': 'v5p-256', 'v6e': 'v6e-256'}
LARGER = {'v3-256': 'v3-512', 'v4-256': 'v4-512', 'v5p-256': 'v5p-512', 'v6e-256': 'v6e-512'}
# The slice of each generation `--small` compiles the same per-device batch on.
SMALL = {'v3': 'v3-8', 'v4': 'v4-8', 'v5p': 'v5p-8', 'v6e': 'v6e-8'}
# What a user can change without changing the recipe's numbers (the batch per core is the
# recipe's batch over the slice; a scanned encoder has no estimate: the cost model counts its
# loop once).
SETTINGS = {
    'defaults': {},
    'remat=full': {'model.remat': 'full'},
    'attention=einsum': {'model.attention': 'einsum'},
    'fsdp': {'mesh.data': 1, 'mesh.fsdp': -1},
    'bfloat16': {'model.dtype': 'bfloat16'},
    'float32': {'model.dtype': 'float32'},
    'mu=bfloat16': {'mu_dtype': 'bfloat16'},
    'bfloat16+mu': {'model.dtype': 'bfloat16', 'mu_dtype': 'bfloat16'},
}


def setting_values(name: str) -> dict:
  """The config values of a setting: a name of `SETTINGS`, or names joined by '+'
  ('float32+attention=einsum'), later names winning; None for an unknown name."""
  if name in SETTINGS:
    return SETTINGS[name]
  parts = [SETTINGS.get(part) for part in name.split('+')]
  return None if None in parts else {k: v for part in parts for k, v in part.items()}


def plan_config(model: str, slice_name: str, settings: dict, layers=None):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import plans  # pylint: disable=g-import-not-at-top
  config = plans.get_config(('pretrain', model))
  common.apply(config, settings)
  config.compile_for = slice_name
  if layers:
    config.model.num_layers = layers
  return config


class NoEstimate(Exception):
  """The cost model gave no usable time for the program."""


def measure(config) -> dict:
  """The train step's figures that grow with depth (seconds, FLOPs, bytes) and the rest: the
  train step alone is compiled (every plan prints the eval step's too)."""
  from vit_jax.parallel import memory  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program as program_lib  # pylint: disable=g-import-not-at-top
  with contextlib.redirect_stdout(io.StringIO()):
    prog = program_lib.build_program(config)
    start = time.perf_counter()
    compiled = prog.train_fn.lower(*prog.abstract_train_args()).compile()
  report = dict(memory.step_stats(compiled, time.perf_counter() - start),
                devices=prog.mesh.devices.size)
  found = prog.estimate(report)
  if 'missing' in found or found['train'] is None:
    raise NoEstimate(f'no estimate: the cost model gave {report["optimal_seconds"]} s '
                     f'(negative: ops it could not cost)')
  train = found['train']
  return dict(
      seconds=train['seconds'], flops=train['flops'], uncosted_flops=train['uncosted_flops'],
      peak_bytes=report['peak_bytes'], compile_seconds=report['compile_seconds'],
      devices=report['devices'], device_kind=prog.target.chip.name,
      hbm_bytes=prog.target.hbm_bytes, chip=prog.target.chip, depth=prog.model.num_layers)


def extrapolate(low: dict, high: dict, depth: int) -> dict:
  """The figures of a `depth`-block encoder from those of two shallower ones: every block of an
  unrolled encoder compiles to the same ops, and the cost model sums a bound per op, so seconds,
  FLOPs and bytes are linear in the depth."""
  out = dict(high)
  for key in ('seconds', 'flops', 'uncosted_flops', 'peak_bytes'):
    slope = (high[key] - low[key]) / (high['depth'] - low['depth'])
    out[key] = high[key] + slope * (depth - high['depth'])
  out['compile_seconds'] = low['compile_seconds'] + high['compile_seconds']
  out['depth'] = depth
  return out


def compiled_on(slice_name: str, settings: dict, batch: int, small: bool):
  """(the slice a row compiles for, its global batch): with `small`, the generation's 8-slice
  at the same per-device batch, unless `settings` shard the parameters over the slice."""
  from vit_jax.platform import targets  # pylint: disable=g-import-not-at-top
  if not small or any(key.startswith('mesh.') for key in settings):
    return slice_name, batch
  target = targets.parse(slice_name)
  smaller = targets.parse(SMALL[target.chip.target])
  return smaller.name, batch * smaller.num_devices // target.num_devices


def run(model: str, slice_name: str, setting: str, depths=(), small=False) -> dict:
  """One plan's row: the estimate (compiled at full depth, or extrapolated from `depths`;
  on the 8-slice of the generation with `small`), or the error line that stopped it."""
  from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
  config = plan_config(model, slice_name, setting_values(setting))
  row = dict(recipe='pretrain', model=model, slice=slice_name, setting=setting,
             batch=config.batch_size, image_size=config.image_size, dtype=config.model.dtype,
             mu_dtype=config.mu_dtype, remat=config.model.remat,
             attention=config.model.attention, mesh=dict(config.mesh))
  compile_for, batch = compiled_on(slice_name, setting_values(setting), config.batch_size, small)
  settings = dict(setting_values(setting), batch_size=batch)
  if compile_for != slice_name:
    row.update(compiled_for=compile_for, compiled_batch=batch)
    config = plan_config(model, compile_for, settings)
  start = time.perf_counter()
  try:
    if depths:
      low, high = (measure(plan_config(model, compile_for, settings, d)) for d in depths)
      from vit_jax import models  # pylint: disable=g-import-not-at-top
      figures = extrapolate(low, high, models.decode(config.model_name)[1]['num_layers'])
      row['extrapolated_from_depths'] = list(depths)
    else:
      figures = measure(config)
  except (UserError, NoEstimate) as e:
    row.update(error=str(e)[:300], wall_seconds=round(time.perf_counter() - start, 1))
    return row
  chip = figures['chip']
  per_chip = config.batch_size / figures['devices'] * chip.slices.devices_per_chip
  row.update(
      devices=figures['devices'], device_kind=figures['device_kind'], depth=figures['depth'],
      step_ms=round(figures['seconds'] * 1e3, 2),
      images_per_second_per_chip=round(per_chip / figures['seconds'], 1),
      utilisation=round(figures['flops'] / figures['seconds'] / chip.bf16_flops, 4),
      tflop_per_device=round(figures['flops'] / 1e12, 3),
      uncosted_tflop=round(figures['uncosted_flops'] / 1e12, 3),
      peak_gib=round(figures['peak_bytes'] / 2 ** 30, 2),
      hbm_gib=round(figures['hbm_bytes'] / 2 ** 30, 2),
      compile_seconds=round(figures['compile_seconds'], 1),
      wall_seconds=round(time.perf_counter() - start, 1))
  return row


def jobs(only: str, models, settings=(), generations=tuple(GENERATIONS)) -> list:
  """(model, slice, setting) of every row asked for: `settings` (names of `SETTINGS`) on each
  generation's slice (default: the defaults alone) and on each plan's slice (default: each
  setting but the defaults)."""
  from vit_jax.configs import recipes  # pylint: disable=g-import-not-at-top
  out = []
  if only in ('', 'generations'):
    for model in models:
      for slice_name in (GENERATIONS[g] for g in generations):
        sliced = LARGER[slice_name] if model == 'H/14' else slice_name
        out += [(model, sliced, s) for s in settings or ('defaults',)]
  if only in ('', 'settings'):
    for model in models:
      planned = recipes.TPU_PLANS[('pretrain', model)]['slice']
      out += [(model, planned, s) for s in settings or SETTINGS if s != 'defaults']
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default='', choices=('', 'generations', 'settings'))
  parser.add_argument('--models', default=','.join(MODELS), help='comma-separated: B/16,L/16')
  parser.add_argument('--generations', default=','.join(GENERATIONS), help='with '
                      '--only=generations, the comma-separated generations: v3,v4')
  parser.add_argument('--settings', default='', help='comma-separated names of `SETTINGS` '
                      '(default: the defaults on each generation, the others on each plan\'s '
                      'slice)')
  parser.add_argument('--json', default='', help='also append one JSON line per row here')
  parser.add_argument('--small', action='store_true', help='compile the same per-device batch on '
                      'the generation\'s 8-slice (v3-8, v4-8, v5p-8, v6e-8) where the mesh is '
                      'data-parallel')
  parser.add_argument('--depths', default='', help='two encoder depths (e.g. 2,4): compile '
                      'those and extrapolate to the model\'s depth instead of compiling it')
  args = parser.parse_args()
  for flag, known in (('settings', SETTINGS), ('generations', GENERATIONS)):
    unknown = sorted(n for n in getattr(args, flag).split(',')
                     if n and (setting_values(n) is None if flag == 'settings' else n not in known))
    if unknown:
      parser.error(f'unknown --{flag} {",".join(unknown)}: use names of {", ".join(known)}'
                   + (' (or names joined by +)' if flag == 'settings' else ''))
  tf_import.import_quietly()
  print('| model | slice | setting | train step (ms) | images/s per chip | utilisation | '
        'peak / HBM (GiB) |')
  print('|---|---|---|---|---|---|---|')
  for model, slice_name, setting in jobs(args.only, args.models.split(','),
                                         [s for s in args.settings.split(',') if s],
                                         args.generations.split(',')):
    row = run(model, slice_name, setting,
              tuple(int(d) for d in args.depths.split(',')) if args.depths else (), args.small)
    if 'error' in row:
      print(f'| ViT-{model} | {slice_name} | {setting} | - | - | - | {row["error"][:90]} |',
            flush=True)
    else:
      print(f'| ViT-{model} | {slice_name} | {setting} | {row["step_ms"]:.1f} | '
            f'{row["images_per_second_per_chip"]:,.0f} | {row["utilisation"]:.0%} | '
            f'{row["peak_gib"]:.2f} / {row["hbm_gib"]:.4g} |', flush=True)
    if args.json:
      with open(args.json, 'a') as f:
        f.write(json.dumps(row) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
