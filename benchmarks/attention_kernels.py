"""The attention kernels of `model.attention` on this machine's CPU, alternated in one process.

  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 PYTHONPATH=. .venv/bin/python \
      benchmarks/attention_kernels.py --rows=ViT-Ti/16:32:224,ViT-B/16:8:224 --rounds=5 --steps=3

For each row (model:batch:px) and mode (train: the trainer's jitted train step, forward +
backward + Adam; infer: the forward pass), fp32 on one device, both kernels are compiled first,
then timed in turn, `--rounds` times `--steps` steps each (a shared machine drifts, so neither
kernel gets the quiet minutes). Prints, per kernel, the median over all its timed steps of the
wall time and of this process's CPU time (user + system, all threads: the work done, which
other jobs on the machine disturb less than the wall time), the ratios, and in how many rounds
einsum had the lower median wall time; this chose `auto`'s CPU entry (vit_jax/models/
attention.py: AUTO).
"""

import platform
import statistics
import subprocess
import time

from absl import app
from absl import flags
import jax

from vit_jax.tools.benchmarking import ours

_ROWS = flags.DEFINE_string('rows', 'ViT-Ti/16:32:224,ViT-B/16:8:224', 'model:batch:px,...')
_MODES = flags.DEFINE_list('modes', ['train', 'infer'], 'train and/or infer')
_KERNELS = flags.DEFINE_list('kernels', ['einsum', 'dot_product'], 'model.attention values')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Alternations of the kernels.')
_STEPS = flags.DEFINE_integer('steps', 3, 'Timed steps per kernel per round.')


def _cpu_name() -> str:
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
      if line.startswith('Model name:'):
        return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown CPU'


def _prepare(model: str, batch: int, size: int, mode: str, kernel: str) -> ours.Prepared:
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config()
  ours.set_benchmark_values(config, model, batch, size, 'float32')
  with config.unlocked():
    config.model.attention = kernel
  return ours.prepare_train(config) if mode == 'train' else ours.prepare_infer(config)


def _timed_steps(step, steps: int):
  """[(wall s, process CPU s)] of `steps` device-synchronised calls."""
  out = []
  for _ in range(steps):
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(step())
    out.append((time.perf_counter() - wall, time.process_time() - cpu))
  return out


def measure_row(model: str, batch: int, size: int, mode: str, kernels, rounds: int,
                steps: int) -> dict:
  prepared = {k: _prepare(model, batch, size, mode, k) for k in kernels}
  for p in prepared.values():
    jax.block_until_ready(p.step())  # warm-up
  times = {k: [] for k in kernels}
  wins = {k: 0 for k in kernels}
  for _ in range(rounds):
    medians = {}
    for k in kernels:
      timed = _timed_steps(prepared[k].step, steps)
      times[k] += timed
      medians[k] = statistics.median(w for w, _ in timed)
    wins[min(medians, key=medians.get)] += 1
  return {'wall_s': {k: statistics.median(w for w, _ in v) for k, v in times.items()},
          'cpu_s': {k: statistics.median(c for _, c in v) for k, v in times.items()},
          'wins': wins}


def main(argv):
  del argv
  kernels = _KERNELS.value
  print(f'{_cpu_name()}, {jax.device_count()} device(s); {_ROUNDS.value} rounds x '
        f'{_STEPS.value} steps per kernel, alternating; fp32')
  head = ' | '.join(f'{k} wall s (img/s) | {k} CPU s' for k in kernels)
  print(f'| model | mode | batch | px | {head} | {kernels[1]} / {kernels[0]} wall | '
        f'{kernels[1]} / {kernels[0]} CPU | rounds {kernels[0]} faster |')
  print('|' + '---|' * (7 + 2 * len(kernels)))
  for row in _ROWS.value.split(','):
    model, batch, size = row.split(':')
    for mode in _MODES.value:
      r = measure_row(model, int(batch), int(size), mode, kernels, _ROUNDS.value, _STEPS.value)
      wall, cpu = r['wall_s'], r['cpu_s']
      cells = ' | '.join(f'{wall[k]:.3f} ({int(batch) / wall[k]:.1f}) | {cpu[k]:.2f}'
                         for k in kernels)
      a, b = kernels[0], kernels[1]
      print(f'| {model} | {mode} | {batch} | {size} | {cells} | {wall[b] / wall[a]:.2f} | '
            f'{cpu[b] / cpu[a]:.2f} | {r["wins"][a]}/{_ROUNDS.value} |', flush=True)


if __name__ == '__main__':
  app.run(main)
