"""A sweep's results: settings averaged over seeds, the best setting, tables and a plot.

  aggregate(outcomes)        -> [Row]: one per setting (values without the seed), mean/std/n
  best_settings(rows, group) -> the setting with the highest mean (one per group value)
  write(...)                 -> results.csv (every run), results.md (grid and final tables),
                                <metric>_vs_<x>.png, best.json
"""

import csv
import dataclasses
import io
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vit_jax.fileio import files_for
from vit_jax.tools.sweeps.spec import SEED, Sweep

Setting = Tuple[Tuple[str, Any], ...]


@dataclasses.dataclass
class Row:
  setting: Setting
  metrics: List[float]
  pruned: int = 0  # runs of this setting that the pruner stopped (not in the mean)

  @property
  def mean(self) -> float:
    return float(np.mean(self.metrics)) if self.metrics else float('nan')

  @property
  def std(self) -> float:
    return float(np.std(self.metrics, ddof=1)) if len(self.metrics) > 1 else 0.0

  def value(self, key):
    return dict(self.setting).get(key)


def aggregate(outcomes) -> List[Row]:
  rows: Dict[Setting, Row] = {}
  for outcome in outcomes:
    setting = outcome.run.setting()
    row = rows.setdefault(setting, Row(setting, []))
    if outcome.metric is not None and outcome.status in ('done', 'skipped'):
      row.metrics.append(outcome.metric)
    row.pruned += outcome.status == 'pruned'
  return list(rows.values())


def best_settings(rows: Sequence[Row], group: Optional[str]) -> List[Setting]:
  """The highest-mean setting, or one per value of `group` (rows without results ignored)."""
  scored = [r for r in rows if r.metrics]
  if not group:
    return [max(scored, key=lambda r: r.mean).setting] if scored else []
  best = {}
  for row in scored:
    key = row.value(group)
    if key not in best or row.mean > best[key].mean:
      best[key] = row
  return [best[k].setting for k in sorted(best, key=str)]


def _fmt(row: Row) -> str:
  if not row.metrics:
    return 'pruned' if row.pruned else 'failed'
  pruned = f', {row.pruned} pruned' if row.pruned else ''
  if len(row.metrics) == 1:
    return f'{100 * row.mean:.2f}' + (f' (n=1{pruned})' if pruned else '')
  return f'{100 * row.mean:.2f} ± {100 * row.std:.2f} (n={len(row.metrics)}{pruned})'


def markdown(sweep: Sweep, grid_rows, final_rows, best: List[Setting]) -> str:
  keys = [k for k in sweep.keys if k != SEED]
  seeds = sweep.grid.get(SEED)
  unit = f'{sweep.metric} in % (mean ± std over seeds {seeds})' if seeds else f'{sweep.metric} in %'
  phase = 'dev split' if sweep.select else 'eval split'
  # A grid of seeds only has one setting: the base config ('setting' column).
  header = ['| ' + ' | '.join(keys or ['setting']) + ' | ' + sweep.metric + ' |',
            '|' + '---|' * (len(keys or ['setting']) + 1)]
  values = lambda row: ' | '.join(str(row.value(k)) for k in keys) if keys else 'base'
  lines = [f'Grid ({phase}); {unit}; best marked **:', '', *header]
  for row in grid_rows:
    cell = _fmt(row)
    if row.setting in best:
      cell = f'**{cell}**'
    lines.append(f'| {values(row)} | {cell} |')
  if final_rows:
    lines += ['', f'Final runs of the best setting(s) ({sweep.select.get("final") or "as grid"}):',
              '', *header]
    for row in final_rows:
      lines.append(f'| {values(row)} | {_fmt(row)} |')
  return '\n'.join(lines) + '\n'


def write_csv(path: str, sweep: Sweep, outcomes) -> None:
  keys = sweep.keys
  text = io.StringIO(newline='')
  writer = csv.writer(text)
  writer.writerow(['phase', 'run'] + keys + [sweep.metric, 'status', 'seconds'])
  for o in outcomes:
    writer.writerow([o.run.phase, o.run.name] + [o.run.value(k) for k in keys] +
                    [o.metric, o.status, None if o.seconds is None else round(o.seconds, 1)])
  with files_for(path).GFile(path, 'w') as f:
    f.write(text.getvalue())


def plot(path: str, sweep: Sweep, rows: Sequence[Row]) -> None:
  """metric against sweep.x; one line per combination of the other (non-seed) keys."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  others = [k for k in sweep.keys if k not in (SEED, sweep.x)]
  lines: Dict[Tuple, List[Row]] = {}
  for row in rows:
    if row.metrics:
      lines.setdefault(tuple(row.value(k) for k in others), []).append(row)
  fig, ax = plt.subplots(figsize=(6, 4))
  numeric = all(isinstance(r.value(sweep.x), (int, float)) for r in rows)
  for label, members in sorted(lines.items(), key=lambda kv: str(kv[0])):
    members.sort(key=lambda r: r.value(sweep.x) if numeric else str(r.value(sweep.x)))
    xs = [r.value(sweep.x) if numeric else str(r.value(sweep.x)) for r in members]
    ax.errorbar(xs, [100 * r.mean for r in members], yerr=[100 * r.std for r in members],
                marker='o', capsize=3,
                label=', '.join(f'{k}={v}' for k, v in zip(others, label)) or None)
  if numeric:
    values = [r.value(sweep.x) for r in rows]
    if min(values) > 0 and max(values) / min(values) >= 10:
      ax.set_xscale('log')
  ax.set_xlabel(sweep.x)
  ax.set_ylabel(f'{sweep.metric} (%)' + (' on the dev split' if sweep.select else ''))
  if any(label for label in lines):
    ax.legend()
  ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(sweep.path))) or sweep.path)
  fig.tight_layout()
  with files_for(path).GFile(path, 'wb') as f:
    fig.savefig(f, dpi=100, format='png')
  plt.close(fig)


def write(root: str, sweep: Sweep, grid_outcomes, final_outcomes, best) -> Dict[str, Any]:
  grid_rows, final_rows = aggregate(grid_outcomes), aggregate(final_outcomes)
  write_csv(os.path.join(root, 'results.csv'), sweep, list(grid_outcomes) + list(final_outcomes))
  table = markdown(sweep, grid_rows, final_rows, best)
  if sweep.summary is not None:  # over the runs that report: the final ones, else the grid's
    reported = final_outcomes if sweep.select else grid_outcomes
    table += '\n' + sweep.summary([{**dict(o.run.values), sweep.metric: o.metric}
                                   for o in reported if o.status == 'done'])
  with files_for(root).GFile(os.path.join(root, 'results.md'), 'w') as f:
    f.write(table)
  png = os.path.join(root, f'{sweep.metric}_vs_{sweep.x.split(".")[-1]}.png')
  plot(png, sweep, grid_rows)
  summary = {
      'metric': sweep.metric,
      'best': [dict(s) for s in best],
      'grid': [{**dict(r.setting), 'mean': r.mean, 'std': r.std, 'n': len(r.metrics)}
               for r in grid_rows],
      'final': [{**dict(r.setting), 'mean': r.mean, 'std': r.std, 'n': len(r.metrics)}
                for r in final_rows],
  }
  with files_for(root).GFile(os.path.join(root, 'best.json'), 'w') as f:
    json.dump(summary, f, indent=1, default=str)
  summary['table'], summary['plot'] = table, png
  return summary


__all__ = ['Row', 'aggregate', 'best_settings', 'markdown', 'write', 'plot']
