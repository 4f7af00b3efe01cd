"""Compile time and memory of one train step, unrolled vs scanned encoder (`model.scan`).

One measurement per process (nothing cached in between; no persistent compilation cache):

  PYTHONPATH=. .venv/bin/python benchmarks/scan_compile.py --model=ViT-B/16 --batch_size=8 \
      --image_size=224 --remat=none --scan=true
  # the TPU compiler, for a slice without its hardware (`make tpu-compiler`):
  PYTHONPATH=. .venv/bin/python benchmarks/scan_compile.py --model=ViT-H/14 --batch_size=16 \
      --image_size=518 --remat=full --scan=true --target=v3-8

Prints one JSON line: trace+lower seconds, compile seconds, and XLA's per-device memory figures
(`Program.memory_report`'s peak: arguments + outputs - aliased + temporaries) in GiB. On CPU the
step runs on one device; with --target on every device of the slice, data parallel.
"""

import argparse
import json
import os
import time


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model', default='ViT-B/16')
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--remat', default='none')
  parser.add_argument('--scan', default='false')
  parser.add_argument('--dtype', default='float32')
  parser.add_argument('--target', default='', help="a TPU slice (v3-8) or topology (v3:2x2); '' = CPU")
  args = parser.parse_args()
  os.environ.pop('JAX_COMPILATION_CACHE_DIR', None)

  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.benchmarking import ours  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import memory  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top

  devices = None
  if args.target:
    from vit_jax.platform import targets  # pylint: disable=g-import-not-at-top
    devices = targets.devices(targets.parse(args.target))
  config = mnist5k.get_config()
  ours.set_benchmark_values(config, args.model, args.batch_size, args.image_size, args.dtype)
  config.total_steps, config.warmup_steps = 20000, 500
  config.model.remat, config.model.scan = args.remat, args.scan.lower() in ('1', 'true')
  if devices is not None:
    config.mesh.data = -1
  prog = program.build_program(config, devices or jax.devices()[:1], require_dataset=False)
  start = time.perf_counter()
  lowered = prog.train_fn.lower(*prog.abstract_train_args())
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  compiled_at = time.perf_counter()
  stats = compiled.memory_analysis()
  gib = lambda b: round(int(b) / memory.GIB, 3)
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
          + stats.temp_size_in_bytes)
  print(json.dumps({
      'model': args.model, 'batch': args.batch_size, 'px': args.image_size, 'remat': args.remat,
      'scan': config.model.scan, 'dtype': args.dtype, 'target': args.target or 'cpu',
      'devices': int(prog.mesh.devices.size), 'lower_s': round(lowered_at - start, 1),
      'compile_s': round(compiled_at - lowered_at, 1),
      'argument_gib': gib(stats.argument_size_in_bytes), 'temp_gib': gib(stats.temp_size_in_bytes),
      'peak_gib': gib(peak)}), flush=True)


if __name__ == '__main__':
  main()
