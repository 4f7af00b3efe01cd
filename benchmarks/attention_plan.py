"""Per-core peak memory and compile time of the train step for a TPU slice, by attention kernel.

  PYTHONPATH=. .venv/bin/python benchmarks/attention_plan.py \
      --rows=ViT-L/16:384,ViT-L/16:512,ViT-H/14:518 --kernels=einsum,dot_product,flash

The TPU compiler (libtpu at --libtpu, no TPU needed) compiles the trainer's own train step
(`Program.memory_report`) for the devices of --topology: configs/mnist5k.py with the row's model
and image size, --batch_size global (2 per core on v3:2x2), 1,000 classes, 3 channels,
imagenet2012 (not read: compile-only), 20,000 steps with 500 warm-up, fp32 Adam, remat none,
data parallel. One compile at a time, in this order; compile time is wall time on this machine.
"""

import os
import time

from absl import app
from absl import flags
import jax

_ROWS = flags.DEFINE_string('rows', 'ViT-L/16:384,ViT-L/16:512,ViT-H/14:518', 'model:px,...')
_KERNELS = flags.DEFINE_list('kernels', ['einsum', 'dot_product', 'flash'],
                             'model.attention values')
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Global batch.')
_REMAT = flags.DEFINE_string('remat', 'none', 'model.remat')
_TOPOLOGY = flags.DEFINE_string('topology', 'v3:2x2', 'TPU topology name')
_LIBTPU = flags.DEFINE_string('libtpu', '/tmp/tpuc/libtpu/libtpu.so', 'The TPU compiler.')

GIB = 2 ** 30


def tpu_devices(topology: str, libtpu: str, accelerator: str = 'v3-8'):
  os.environ.update(TPU_LIBRARY_PATH=libtpu, TPU_ACCELERATOR_TYPE=accelerator, TPU_WORKER_ID='0',
                    TPU_WORKER_HOSTNAMES='localhost', TPU_SKIP_MDS_QUERY='1',
                    ALLOW_MULTIPLE_LIBTPU_LOAD='1')  # other compile-only processes may run
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return list(topologies.get_topology_desc(topology_name=topology, platform='tpu').devices)


def plan_config(model: str, size: int, batch: int, attention: str, remat: str):
  from vit_jax.configs import common, mnist5k  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config()
  config.model_name, config.image_size, config.batch_size = model, size, batch
  config.num_classes, config.dataset = 1000, 'imagenet2012'
  common.rgb_input(config)
  config.compile_only, config.total_steps, config.warmup_steps = True, 20000, 500
  config.model.attention, config.model.remat = attention, remat
  return config


def main(argv):
  del argv
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top
  devices = tpu_devices(_TOPOLOGY.value, _LIBTPU.value)
  print(f'{_TOPOLOGY.value} ({len(devices)} {devices[0].device_kind} cores), global batch '
        f'{_BATCH.value}, remat {_REMAT.value}, fp32 Adam; jax {jax.__version__}')
  print('| model | px | tokens | attention | peak GiB / core | temporaries GiB | compile s |')
  print('|---|---|---|---|---|---|---|')
  for row in _ROWS.value.split(','):
    model, size = row.split(':')
    for kernel in _KERNELS.value:
      config = plan_config(model, int(size), _BATCH.value, kernel, _REMAT.value)
      start = time.perf_counter()
      prog = program.build_program(config, devices)
      report = prog.memory_report()
      seconds = time.perf_counter() - start
      grid = int(size) // prog.model.patch[0]
      print(f'| {model} | {size} | {grid * grid + 1} | {kernel} | '
            f'{report["peak_bytes"] / GIB:.2f} | {report["temp_bytes"] / GIB:.2f} | '
            f'{seconds:.0f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
