"""fp8 against bf16 on one short training run: the same config, seeds and steps trained twice by
`python -m vit_jax.main`, with `model.dtype=bfloat16` and then also `model.fp8=True`, and the two
loss curves side by side.

  PYTHONPATH=. python benchmarks/fp8_curve.py --config=configs/default.py:steps=600 \
      --workdir=DIR [--json=FILE] [--config.log_every=20 ...]

Every flag after --workdir and --json goes to both runs. Prints the logged train losses (step,
bf16, fp8, difference), then the largest and mean absolute difference, each run's final test
top-1 and its logged throughput (img/s, the median over its log lines after the first); --json
appends all of it as one JSON line. fp8 needs an NVIDIA GPU of compute capability 8.9 or more:
elsewhere its run is refused, unless VIT_JAX_FP8_EMULATION_FOR_TESTS=1 (XLA:CPU then computes the
fp8 dots in float32: the numbers, not the speed).
"""

import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Sequence

from vit_jax.tools.benchmarking import compare as bench

RUNS = (('bf16', ['--config.model.dtype=bfloat16']),
        ('fp8', ['--config.model.dtype=bfloat16', '--config.model.fp8=True']))


def _take(argv: List[str], name: str) -> str:
  """The value of --name=VALUE, removed from `argv`."""
  for arg in list(argv):
    if arg.startswith(f'--{name}='):
      argv.remove(arg)
      return arg.split('=', 1)[1]
  return ''


def train(name: str, flags: Sequence[str], workdir: str) -> Dict:
  """One run of the trainer; its logged train losses, throughput and final evaluation."""
  out = os.path.join(workdir, name)
  cmd = [sys.executable, '-m', 'vit_jax.main', *flags, f'--workdir={out}',
         '--config.progress=False']
  proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
  if proc.returncode:
    raise SystemExit(f'error: the {name} run failed: {proc.stderr.strip().splitlines()[-1]}')
  with open(os.path.join(out, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  train_records = [r for r in records if r['split'] == 'train']
  evals = [r for r in records if r['split'] == 'eval']
  rates = [r['img_per_s'] for r in train_records if 'img_per_s' in r]
  return {'run': name, 'steps': [r['step'] for r in train_records],
          'losses': [r['loss'] for r in train_records],
          'img_per_s': statistics.median(rates) if rates else None,
          'eval_accuracy': evals[-1]['accuracy'] if evals else None}


def compare(runs: Sequence[Dict]) -> Dict:
  """The differences of the second run's losses from the first's, step by step."""
  first, second = runs
  if first['steps'] != second['steps']:
    raise SystemExit('error: the two runs logged different steps')
  diffs = [b - a for a, b in zip(first['losses'], second['losses'])]
  return {'max_abs_diff': max(map(abs, diffs)), 'mean_abs_diff': statistics.mean(map(abs, diffs)),
          'final_diff': diffs[-1]}


def main(argv: List[str]) -> int:
  argv = list(argv)
  workdir, json_path = _take(argv, 'workdir'), _take(argv, 'json')
  if not workdir:
    raise SystemExit('error: pass --workdir=DIR (the two runs are written below it)')
  runs = [train(name, [*argv, *extra], workdir) for name, extra in RUNS]
  summary = compare(runs)
  print('| step | bf16 loss | fp8 loss | fp8 - bf16 |\n|---|---|---|---|')
  for step, a, b in zip(runs[0]['steps'], runs[0]['losses'], runs[1]['losses']):
    print(f'| {step} | {a:.4f} | {b:.4f} | {b - a:+.4f} |')
  print(f'largest |difference| {summary["max_abs_diff"]:.4f}, mean {summary["mean_abs_diff"]:.4f};'
        + ''.join(f' {r["run"]}: test top-1 {r["eval_accuracy"]}, {r["img_per_s"] or 0:,.0f} img/s;'
                  for r in runs))
  if json_path:
    with open(json_path, 'a') as f:
      f.write(json.dumps({'benchmark': 'fp8_curve', 'flags': argv, 'runs': runs, **summary,
                          'versions': bench.versions()}) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
