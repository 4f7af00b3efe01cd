"""Speed against timm: runs `python -m vit_jax bench --compare=timm --json` for each row and
prints a markdown table (needs torch and timm: `make test-interop`; without torchvision the
rows run with the test stand-in, tests/interop/stubs, on PYTHONPATH).

  PYTHONPATH=. .venv/bin/python benchmarks/speed_table.py \
      --rows=ViT-Ti/16:32:224:train,ViT-B/16:8:224:train --steps=5 --rounds=2

Each row is model:batch:image_size:mode. One row at a time, each in its own process (so one
row's memory does not weigh on the next); both sides are timed alternately in that process. The
first column names the processor (model name, family/model); after the table, one line per
processor gives its vector extensions.
"""

import importlib.util
import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from vit_jax.platform import cpus

_ROWS = flags.DEFINE_list('rows', ['ViT-Ti/16:32:224:train', 'ViT-Ti/16:32:224:infer'],
                          'model:batch:image_size:mode, comma-separated.')
_STEPS = flags.DEFINE_integer('steps', 5, 'Timed steps per round (median reported).')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Alternations of ours and timm.')

COLUMNS = ('processor', 'model', 'mode', 'batch', 'px', 'ours img/s', 'timm img/s', 'ours / timm',
           'GFLOP / img (XLA)', 'achieved GFLOP/s', 'matmul peak GFLOP/s', 'utilisation',
           'compile s', 'page faults / step')


def _env() -> dict:
  """This environment, with the torchvision stand-in (tests/interop/stubs) first on PYTHONPATH
  when no torchvision is installed (timm imports it; there is no CPU wheel for torch 2.13)."""
  env = dict(os.environ)
  if importlib.util.find_spec('torchvision') is None:
    stubs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests',
                         'interop', 'stubs')
    env['PYTHONPATH'] = os.pathsep.join(p for p in (stubs, env.get('PYTHONPATH')) if p)
  return env


def measure(model: str, batch: int, size: int, mode: str) -> dict:
  cmd = [sys.executable, '-m', 'vit_jax', 'bench', f'--model={model}', f'--batch_size={batch}',
         f'--image_size={size}', f'--mode={mode}', f'--steps={_STEPS.value}',
         f'--rounds={_ROUNDS.value}', '--compare=timm', '--json']
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_env())
  if proc.returncode:
    raise SystemExit(f'error: {" ".join(cmd)} failed: {proc.stderr.strip().splitlines()[-1]}')
  return json.loads(proc.stdout[proc.stdout.index('{'):])  # the one JSON object it prints


def row(model: str, batch: int, size: int, mode: str, r: dict) -> str:
  cells = (cpus.short(r['processor']), model, mode, batch, size, f'{r["img_per_s"]:.1f}', f'{r["timm_img_per_s"]:.1f}',
           f'{r["ratio_vs_timm"]:.2f}', f'{r["flops_per_img"] / 1e9:.2f}',
           f'{r["achieved_flops"] / 1e9:.1f}', f'{r["matmul_peak_flops"] / 1e9:.1f}',
           f'{r["utilization"]:.0%}', f'{r["compile_s"]:.1f}',
           f'{r["minor_faults_per_step"]:,.0f}')
  return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def main(argv):
  del argv
  print('| ' + ' | '.join(COLUMNS) + ' |')
  print('|' + '---|' * len(COLUMNS))
  seen = set()
  for spec in _ROWS.value:
    model, batch, size, mode = spec.split(':')
    result = measure(model, int(batch), int(size), mode)
    seen.add(cpus.one_line(result['processor']))
    print(row(model, int(batch), int(size), mode, result), flush=True)
  for line in sorted(seen):
    print(f'\nProcessor: {line}')


if __name__ == '__main__':
  app.run(main)
