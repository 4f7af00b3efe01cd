"""The results table of one checkpoint: `results.json` (what a paper cites), `results.md` and
`results.png`, in `<workdir>/evaluations/<checkpoint>/`.

results.json:
  {"format": "vit_jax.evaluation", "version": 1,
   "checkpoint": {"step", "path", "content"} or {"weights", "content"},
   "results": {entry name: {"type", "options", "dataset": {"name", "fingerprint", ...},
                            "metrics": {metric: value}, "seconds"}}}

Written after each evaluator (a temporary file renamed), so a stopped command keeps what it
finished; an entry is rerun only if its type or options changed.
"""

import json
import os
from typing import Dict, Optional

FORMAT, VERSION = 'vit_jax.evaluation', 1
# Metrics shown in the plot: fractions (accuracies); counts, losses and strengths are not.
_NOT_PLOTTED = ('count', 'loss', 'l2', 'seconds')


def load(directory: str, checkpoint: dict) -> Dict[str, dict]:
  """The finished entries of `directory`'s table, if it is this checkpoint's ({} otherwise)."""
  path = os.path.join(directory, 'results.json')
  try:
    with open(path) as f:
      table = json.load(f)
  except (OSError, ValueError):
    return {}
  if table.get('format') != FORMAT or table.get('checkpoint') != checkpoint:
    return {}
  return dict(table.get('results') or {})


def done(finished: Dict[str, dict], name: str, kind: str, options: dict) -> bool:
  """Whether `name` is in the table with the same type and options."""
  row = finished.get(name)
  return bool(row) and row.get('type') == kind and row.get('options') == _jsonable(options)


def row(kind: str, options: dict, dataset: Optional[dict], metrics: dict, seconds: float) -> dict:
  return {'type': kind, 'options': _jsonable(options), 'dataset': dataset,
          'metrics': {k: float(v) for k, v in metrics.items()}, 'seconds': round(seconds, 3)}


def _jsonable(value):
  return json.loads(json.dumps(value, default=str))


def save(directory: str, checkpoint: dict, results: Dict[str, dict]) -> None:
  """Writes results.json and results.md (each a temporary file renamed)."""
  os.makedirs(directory, exist_ok=True)
  table = {'format': FORMAT, 'version': VERSION, 'checkpoint': checkpoint, 'results': results}
  write_text(os.path.join(directory, 'results.json'), json.dumps(table, indent=1, sort_keys=True))
  write_text(os.path.join(directory, 'results.md'), markdown(checkpoint, results))


def write_text(path: str, text: str) -> None:
  """`text` and a newline in `path`, never half written (`files.atomic_write`)."""
  from vit_jax.formats import files  # pylint: disable=g-import-not-at-top
  files.atomic_write(path, lambda f: f.write((text + '\n').encode()))


def describe_checkpoint(checkpoint: dict) -> str:
  if 'weights' in checkpoint:
    return f'weights {checkpoint["weights"]} (content {checkpoint["content"]})'
  return f'step {checkpoint["step"]} of {checkpoint["path"]} (content {checkpoint["content"]})'


def fmt(metric: str, value: float) -> str:
  """A metric as the table shows it: fractions to 4 decimals, others to 4 significant digits."""
  return f'{value:.4f}' if metric not in _NOT_PLOTTED and 0 <= value <= 1 else f'{value:.4g}'


def markdown(checkpoint: dict, results: Dict[str, dict]) -> str:
  """One row per metric: evaluator, type, dataset (name and fingerprint), metric, value."""
  lines = [f'Evaluation of {describe_checkpoint(checkpoint)}', '',
           '| evaluator | type | dataset | metric | value |', '|---|---|---|---|---|']
  for name in sorted(results):
    r = results[name]
    data = r.get('dataset') or {}
    dataset = data.get('name', '')
    if data.get('fingerprint'):
      dataset += f' ({data["fingerprint"]})'
    for metric, value in r['metrics'].items():
      lines.append(f'| {name} | {r["type"]} | {dataset} | {metric} | {fmt(metric, value)} |')
  return '\n'.join(lines)


def plot(directory: str, checkpoint: dict, results: Dict[str, dict]) -> Optional[str]:
  """results.png: one bar per accuracy-like metric (matplotlib, Agg); None if there is none."""
  bars = [(f'{name} {metric}', value) for name in sorted(results)
          for metric, value in results[name]['metrics'].items()
          if metric not in _NOT_PLOTTED and 0.0 <= value <= 1.0]
  if not bars:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 0.4 * len(bars) + 1.2))
  labels, values = zip(*bars)
  ax.barh(range(len(bars)), values, color='tab:blue')
  ax.set_yticks(range(len(bars)), labels)
  ax.invert_yaxis()
  ax.set_xlim(0, 1)
  ax.set_xlabel('accuracy')
  ax.set_title(describe_checkpoint(checkpoint), fontsize=8)
  for i, v in enumerate(values):
    ax.text(min(v, 0.85) + 0.01, i, f'{v:.4f}', va='center', fontsize=8)
  fig.tight_layout()
  path = os.path.join(directory, 'results.png')
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


__all__ = ['FORMAT', 'VERSION', 'describe_checkpoint', 'done', 'fmt', 'load', 'markdown',
           'plot', 'row', 'save']
