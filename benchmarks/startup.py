"""How long the default run takes to say no and to start, each as a ratio to `import jax`.

Times three commands, alternated over --rounds rounds so that load from other processes falls on
all of them alike:

  jax          python -c "import jax"
  error        the default run with an unknown model (`--config.model_name=ViT-Q/3`): the
               seconds until its `error:` line appears
  first_step   the default run (`--config=configs/default.py`): the seconds until its first
               logged step (the progress line `step 1/3000 ...`, --config.log_every=1), then
               stopped

  PYTHONPATH=. .venv/bin/python benchmarks/startup.py --rounds=3 --checkouts=.,../other

Each of --checkouts (git checkouts of this project, e.g. a branch and a worktree of main) is
timed in every round, its commands run from it with it first on PYTHONPATH, so that two versions
are compared side by side under the same load. Appends one JSON line per checkout to
benchmarks/results/startup.jsonl (the processor, the commit, each command's seconds per round, the
medians and the ratios of the medians to `import jax`) and prints it.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from vit_jax.platform import cpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'startup.jsonl')
_MAIN = [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py']


def commands(workdir: str) -> dict:
  """name -> (argv, the pattern of the output line that ends the timing)."""
  return {
      'jax': ([sys.executable, '-c', 'import jax'], None),
      'error': ([*_MAIN, '--config.model_name=ViT-Q/3', f'--workdir={workdir}'], rb'^error: '),
      'first_step': ([*_MAIN, '--config.log_every=1', f'--workdir={workdir}'], rb'^step 1/'),
  }


def seconds_until(argv, pattern, checkout: str) -> float:
  """Wall seconds from starting `argv` in `checkout` to its exit, or to the first output line that
  matches `pattern` (the process is then stopped)."""
  env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
  start = time.perf_counter()
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=checkout,
                          env=env)
  seen = None
  for line in proc.stdout:
    if pattern is not None and re.search(pattern, line.lstrip(b'\r')):
      seen = time.perf_counter() - start
      proc.kill()
      break
  proc.wait()
  if pattern is None:
    if proc.returncode != 0:
      raise SystemExit(f'{argv} failed with status {proc.returncode}')
    return time.perf_counter() - start
  if seen is None:
    raise SystemExit(f'{" ".join(argv)} ended without a line matching {pattern!r}')
  return seen


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--checkouts', default='.', help='comma-separated checkouts to compare')
  args = parser.parse_args()
  checkouts = args.checkouts.split(',')
  times = {c: {name: [] for name in commands('')} for c in checkouts}
  for round_ in range(args.rounds):
    for checkout in checkouts:
      for name, values in times[checkout].items():
        workdir = tempfile.mkdtemp(prefix='vit_jax_startup_')
        argv, pattern = commands(os.path.join(workdir, 'run'))[name]
        try:
          values.append(round(seconds_until(argv, pattern, checkout), 2))
        finally:
          shutil.rmtree(workdir, ignore_errors=True)
        print(f'round {round_ + 1} {checkout} {name}: {values[-1]} s', file=sys.stderr, flush=True)
  os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
  for checkout in checkouts:
    median = {name: round(statistics.median(v), 2) for name, v in times[checkout].items()}
    commit = subprocess.run(['git', '-C', checkout, 'rev-parse', '--short', 'HEAD'],
                            capture_output=True, text=True, check=False).stdout.strip()
    row = {
        'benchmark': 'startup', 'commit': commit, 'processor': cpus.describe(),
        'load_average': [round(v, 1) for v in os.getloadavg()], 'rounds': args.rounds,
        'seconds': times[checkout], 'median_s': median,
        'ratio_to_import_jax': {name: round(median[name] / median['jax'], 2)
                                for name in ('error', 'first_step')},
        'command': (f'PYTHONPATH=. .venv/bin/python benchmarks/startup.py --rounds={args.rounds} '
                    f'--checkouts={args.checkouts}'),
    }
    with open(RESULTS, 'a') as f:
      f.write(json.dumps(row) + '\n')
    print(json.dumps(row))


if __name__ == '__main__':
  main()
