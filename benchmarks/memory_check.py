"""Compile-only's memory prediction against what a real train step uses, on simulated CPU devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/memory_check.py \
      --model=ViT-S/16 --batch_size=32 --mesh=8,1,1

Builds the same `Program` the trainer runs, prints its compile-only report, then initialises the
state and runs 3 steps on random images. Measured: the bytes of live arrays on each device after
the steps (the state plus the last batch, against the predicted argument bytes) and the growth of
the process's peak RSS over the steps (all devices share this process on CPU; against the sum over
devices of the predicted peak minus what was already allocated).
"""

import argparse
import resource
import sys

from vit_jax.platform import tf_import


def _rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='ViT-S/16')
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--mesh', default='8,1,1', help='data,fsdp,model')
  args = parser.parse_args()
  tf_import.import_quietly()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, '.')
  from benchmarks.memory_table import config_for  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import memory, sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program as program_lib  # pylint: disable=g-import-not-at-top

  data, fsdp, model = (int(x) for x in args.mesh.split(','))
  config = config_for(args.model, args.batch_size, dict(data=data, fsdp=fsdp, model=model),
                      'none')
  prog = program_lib.build_program(config)
  predicted = prog.memory_report()
  print(memory.format_report(predicted, prog.describe()))

  rss_start = _rss_bytes()
  state = prog.init_state()
  rng = np.random.default_rng(0)
  local = {'image': rng.uniform(-1, 1, (prog.local_batch, *prog.image_shape)).astype(np.float32),
           'label': rng.integers(0, prog.num_classes, prog.local_batch).astype(np.int32)}
  batch = sharding.shard_batch(local, prog.mesh)
  jax.block_until_ready(state)
  rss_before_steps = _rss_bytes()
  for _ in range(3):
    state, metrics = prog.train_fn(state, batch, prog.dropout_rng, prog.hyper)
  jax.block_until_ready((state, metrics))
  rss_after = _rss_bytes()

  device = jax.devices()[0]
  live = sum(shard.data.nbytes for a in jax.live_arrays() for shard in a.addressable_shards
             if shard.device == device)
  gib = 2 ** 30
  devices = prog.mesh.devices.size
  step_growth = rss_after - rss_before_steps
  predicted_growth = devices * (predicted['temp_bytes'] + predicted['output_bytes'] -
                                predicted['alias_bytes'])
  print(f'measured: live arrays on device 0 after the steps {live / gib:.3f} GiB '
        f'(predicted arguments {predicted["argument_bytes"] / gib:.3f} GiB)')
  print(f'measured: process peak RSS {rss_start / gib:.2f} GiB before init, '
        f'{rss_before_steps / gib:.2f} GiB with state and batch, {rss_after / gib:.2f} GiB after '
        f'3 steps: +{step_growth / gib:.2f} GiB for the steps (predicted temporaries + new '
        f'outputs over {devices} devices: {predicted_growth / gib:.2f} GiB)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
