"""A sweep spec: a Python file whose `get_sweep()` returns a dict, expanded into runs.

  def get_sweep():
    return {
        'config': 'configs/default.py:model_name=ViT-Mu/4,steps=800',  # the --config value
        'overrides': {'warmup_steps': 50},          # fixed --config.* values for every run
        'grid': {'lr': [1e-3, 3e-3], 'seed': [0, 1, 2]},   # every combination is one run
        'variants': {'start': {                      # optional: a grid key whose values name
            'scratch': {},                           # sets of overrides (here: grid 'start':
            'pretrained': {'init': 'runs/pre/grid/seed_{seed}'},  # ['scratch', 'pretrained'])
        }},
        'metric': 'accuracy',                        # of the last 'eval' record (higher = better)
        'x': 'lr',                                   # plot axis (default: the first grid key)
        'group': 'model.classifier',                 # optional: one curve and one best per value
        'select': {                                  # optional: the paper's lr choice on dev
            'dev': {'train_split': 'train[:90%]', 'eval_split': 'train[90%:]'},
            'final': {},                             # the best setting, rerun with these values
        },
        'ranges': {'lr': {'low': 1e-4, 'high': 0.1, 'log': True}},  # optional: sampled keys
        'trials': 20,                                # with ranges: how many runs to sample
        'sampler': 'tpe',                            # with ranges: tpe (default) or random
        'pruner': {'name': 'median', 'n_startup_trials': 5},  # optional: stop runs behind
        'summary': summary,                          # optional: fn(rows) -> Markdown after
    }                                                # the tables (below)

Keys are config keys (dotted for nested ones), or names listed in 'variants'. A string value may
name the run's values in braces ('{seed}': its seed). 'seed' is special: runs that differ only in
the seed are replicates, averaged (mean and std) in the tables and for the choice of the best.
Without 'select', every grid run is a final run and the best setting is reported as well.

Without 'ranges' the runs are the grid's combinations (Optuna's grid sampler: the same runs, in
the same sub-workdirs, as the plain grid). With 'ranges' (each {'low', 'high'} and optionally
'log': True and 'int': True), 'trials' runs are sampled: the range keys from their ranges, the
grid keys from their lists (seed included), by Optuna's TPE or random sampler. 'pruner' names
one of PRUNERS with its keyword arguments for Optuna's class: each periodic evaluation's metric
is reported to it, and a run it stops keeps its checkpoint and is marked pruned.

'summary' is a function of the reported runs' rows (each a dict of its swept values and the
metric, e.g. {'dataset': 'vtab/dtd', 'accuracy': 0.7}) returning Markdown that results.md and
the printed table end with (experiments/vtab/sweep.py: the VTAB table with its group means).
"""

import dataclasses
import importlib.util
import itertools
import os
from typing import Any, Dict, List, Optional, Tuple

from vit_jax.errors import UserError

SEED = 'seed'
# What an 'eval' record of metrics.jsonl holds (vit_jax/train/loop.py's `evaluate`).
EVAL_METRICS = ('accuracy', 'loss', 'count')
KEYS = {'config', 'overrides', 'grid', 'variants', 'metric', 'x', 'group', 'select', 'ranges',
        'trials', 'sampler', 'pruner', 'summary'}
SAMPLERS = ('tpe', 'random')
# name -> Optuna class in optuna.pruners
PRUNERS = {'median': 'MedianPruner', 'percentile': 'PercentilePruner',
           'halving': 'SuccessiveHalvingPruner', 'hyperband': 'HyperbandPruner',
           'threshold': 'ThresholdPruner', 'patient': 'PatientPruner', 'wilcoxon': 'WilcoxonPruner'}
GRID_TYPES = (str, int, float, bool, type(None))


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: its phase ('grid' or 'final'), its varying values and all overrides."""
  phase: str
  values: Tuple[Tuple[str, Any], ...]     # the swept keys of this run, in grid order
  overrides: Tuple[Tuple[str, Any], ...]  # every --config.KEY=VALUE of this run

  @property
  def name(self) -> str:
    parts = [f'{k.split(".")[-1]}_{_text(v)}' for k, v in self.values]
    return f'{self.phase}/' + ('-'.join(parts) or 'base')

  def value(self, key: str):
    return dict(self.values).get(key)

  def setting(self) -> Tuple[Tuple[str, Any], ...]:
    """The values without the seed: runs with the same setting are replicates."""
    return tuple((k, v) for k, v in self.values if k != SEED)


@dataclasses.dataclass(frozen=True)
class Sweep:
  path: str
  config: str
  overrides: Dict[str, Any]
  grid: Dict[str, List[Any]]
  metric: str
  x: str
  group: Optional[str]
  select: Optional[Dict[str, Dict[str, Any]]]
  variants: Dict[str, Dict[str, Dict[str, Any]]] = dataclasses.field(default_factory=dict)
  ranges: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
  trials: Optional[int] = None
  sampler: str = 'tpe'
  pruner: Optional[Dict[str, Any]] = None  # {'name': one of PRUNERS, **its keyword arguments}
  summary: Optional[Any] = None  # fn(rows) -> Markdown after the tables (module docstring)

  @property
  def keys(self) -> List[str]:
    """The swept keys, in the order of run names: the grid's, then the ranges'."""
    return list(self.grid) + [k for k in self.ranges if k not in self.grid]

  def grid_run(self, values: Dict[str, Any]) -> Run:
    """The search run of the swept values `values` (a grid point or a sampled point)."""
    ordered = tuple((k, values[k]) for k in self.keys)
    return Run('grid', ordered, self._overrides((self.select or {}).get('dev', {}), ordered))

  def _overrides(self, phase_values, values) -> Tuple[Tuple[str, Any], ...]:
    swept = {}
    for key, value in values:
      swept.update(self.variants[key][value] if key in self.variants else {key: value})
    names = {k.split('.')[-1]: v for k, v in values}
    merged = _merge(self.overrides, phase_values, tuple(swept.items()))
    return tuple((k, v.format(**names) if isinstance(v, str) and '{' in v else v)
                 for k, v in merged)

  def grid_runs(self) -> List[Run]:
    """Every combination of the grid (with ranges: none, the runs are sampled)."""
    if self.ranges:
      return []
    keys = list(self.grid)
    return [self.grid_run(dict(zip(keys, combo)))
            for combo in itertools.product(*(self.grid[k] for k in keys))]

  def final_runs(self, best_settings: List[Tuple[Tuple[str, Any], ...]]) -> List[Run]:
    """The best setting(s) rerun with the 'final' values, once per seed of the grid."""
    seeds = self.grid.get(SEED, [None])
    final = (self.select or {}).get('final', {})
    runs = []
    for setting in best_settings:
      for seed in seeds:
        values = setting + (((SEED, seed),) if seed is not None else ())
        runs.append(Run('final', values, self._overrides(final, values)))
    return runs


def _merge(*parts) -> Tuple[Tuple[str, Any], ...]:
  out = {}
  for part in parts:
    out.update(dict(part))
  return tuple(out.items())


def _text(value) -> str:
  text = str(value).replace('/', '_').replace(' ', '')
  return text if len(text) < 40 else text[:40]


def load(path: str) -> Sweep:
  """Reads and checks a sweep spec file."""
  if not path or not os.path.isfile(path):
    raise UserError(f'--sweep={path} is not a file: pass a sweep spec such as '
                    f'experiments/posemb/sweep.py')
  module_spec = importlib.util.spec_from_file_location('_sweep_spec', path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except  # a user's file: report, don't crash
    raise UserError(f'cannot load the sweep spec {path} ({type(e).__name__}: {e})') from None
  if not hasattr(module, 'get_sweep'):
    raise UserError(f'{path} has no get_sweep() function returning the sweep dict')
  raw = module.get_sweep()
  if not isinstance(raw, dict):
    raise UserError(f'get_sweep() in {path} returned {type(raw).__name__}, not a dict')
  unknown = sorted(set(raw) - KEYS)
  if unknown:
    raise UserError(f'unknown key(s) {", ".join(unknown)} in the sweep spec {path}: valid are '
                    f'{", ".join(sorted(KEYS))}')
  grid = raw.get('grid') or {}
  ranges = _ranges(raw.get('ranges') or {}, path)
  if not raw.get('config') or not (grid or ranges):
    raise UserError(f'the sweep spec {path} needs a "config" (the --config value) and a '
                    f'non-empty "grid" of config keys to lists of values (or "ranges")')
  for key, values in grid.items():
    if not isinstance(values, (list, tuple)) or not values:
      raise UserError(f'grid key {key!r} in {path} needs a non-empty list of values')
    odd = [v for v in values if not isinstance(v, GRID_TYPES)]
    if odd:
      raise UserError(f'grid key {key!r} in {path} has value(s) {odd[:2]} that are not a str, '
                      f'int, float, bool or None: name them in "variants" instead')
  trials = raw.get('trials')
  if ranges and (not isinstance(trials, int) or trials < 1):
    raise UserError(f'the sweep spec {path} has "ranges": give "trials", the number of runs to '
                    f'sample (a positive int)')
  if not ranges and trials is not None:
    raise UserError(f'"trials" in {path} needs "ranges": a grid runs each combination once')
  sampler = raw.get('sampler') or 'tpe'
  if sampler not in SAMPLERS:
    raise UserError(f'unknown sampler {sampler!r} in {path}: use {" or ".join(SAMPLERS)}')
  pruner = _pruner(raw.get('pruner'), path)
  select = raw.get('select')
  if select is not None and (not isinstance(select, dict) or set(select) - {'dev', 'final'}):
    raise UserError(f'"select" in {path} takes {{"dev": {{...}}, "final": {{...}}}}: the config '
                    f'values of the runs that choose and of the runs that report')
  variants = raw.get('variants') or {}
  for key, table in variants.items():
    if key not in grid or not isinstance(table, dict):
      raise UserError(f'variants key {key!r} in {path} must be a grid key mapping each of its '
                      f'values to a dict of config overrides')
    missing = [v for v in grid[key] if v not in table]
    if missing:
      raise UserError(f'variants[{key!r}] in {path} has no overrides for {missing}')
  swept = [k for k in grid if k != SEED] + list(ranges) + [k for k in grid if k == SEED]
  x = raw.get('x') or swept[0]
  group = raw.get('group')
  for key in [x] + ([group] if group else []):
    if key not in swept:
      raise UserError(f'"{key}" in {path} must be one of the grid keys: {", ".join(swept)}')
  summary = raw.get('summary')
  if summary is not None and not callable(summary):
    raise UserError(f'"summary" in {path} must be a function of the runs\' rows returning '
                    f'Markdown, not {type(summary).__name__}')
  metric = raw.get('metric', 'accuracy')
  if metric not in EVAL_METRICS:  # checked now, not after every run has trained
    raise UserError(f'"metric" in {path} is {metric!r}, which no eval record has: use one of '
                    f'{", ".join(EVAL_METRICS)}')
  return Sweep(path=path, config=raw['config'], overrides=dict(raw.get('overrides') or {}),
               grid={k: list(v) for k, v in grid.items()}, metric=metric,
               x=x, group=group, select=select, variants=variants, ranges=ranges, trials=trials,
               sampler=sampler, pruner=pruner, summary=summary)


def _ranges(raw, path: str) -> Dict[str, Dict[str, Any]]:
  out = {}
  for key, bounds in dict(raw).items():
    ok = isinstance(bounds, dict) and not set(bounds) - {'low', 'high', 'log', 'int'}
    low, high = (bounds.get('low'), bounds.get('high')) if ok else (None, None)
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
    if not ok or not low < high or (bounds.get('log') and low <= 0):
      raise UserError(f'range {key!r} in {path} takes {{"low": L, "high": H}} with L < H, and '
                      f'optionally "log": True (then L > 0) and "int": True; got {bounds!r}')
    out[key] = {'low': low, 'high': high, 'log': bool(bounds.get('log')),
                'int': bool(bounds.get('int'))}
  return out


def _pruner(raw, path: str) -> Optional[Dict[str, Any]]:
  if raw is None or raw == 'none':
    return None
  options = {'name': raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else {}
  if options.get('name') not in PRUNERS:
    raise UserError(f'"pruner" in {path} takes a name or {{"name": NAME, **options}} with NAME '
                    f'one of {", ".join(PRUNERS)} (Optuna\'s pruners); got {raw!r}')
  return options


__all__ = ['Run', 'Sweep', 'load', 'SEED', 'PRUNERS', 'SAMPLERS', 'EVAL_METRICS']
