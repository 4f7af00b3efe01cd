"""Per-device memory of the train step under each sharding strategy, from compilation alone.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/memory_table.py \
      --models=ViT-L/16,ViT-H/14 --batch_size=64 > table.md

Each cell is `vit_jax.main --config.compile_only=True` for that model and mesh (Adam, fp32
parameters and moments, 224 px, 1000 classes): nothing is allocated or trained, no dataset is read.
"""

import argparse
import contextlib
import sys

from vit_jax.platform import tf_import

STRATEGIES = [
    ('data parallel', dict(data=-1, fsdp=1, model=1)),
    ('FSDP', dict(data=1, fsdp=-1, model=1)),
    ('tensor parallel', dict(data=1, fsdp=1, model=-1)),
    ('FSDP x tensor', dict(data=1, fsdp=-1, model=2)),
]


def config_for(model_name: str, batch_size: int, mesh: dict, remat: str):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  c = common.base_config()
  c.model_name, c.num_classes, c.image_size = model_name, 1000, 224
  c.dataset, c.data_dir = 'imagenet2012', '/nonexistent'  # compile-only: never read
  c.batch_size, c.total_steps, c.warmup_steps = batch_size, 100, 10
  common.rgb_input(c)
  c.compile_only, c.model.remat = True, remat
  for axis, size in mesh.items():
    c.mesh[axis] = size
  return c


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='ViT-L/16,ViT-H/14')
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--remat', default='none')
  args = parser.parse_args()
  tf_import.import_quietly()
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  gib = 2 ** 30
  print(f'{jax.device_count()} devices, global batch {args.batch_size}, 224 px, Adam fp32, '
        f'remat {args.remat}; GiB per device\n')
  print('| model | strategy (mesh data x fsdp x model) | params | optimizer | params + optimizer |'
        ' compiled arguments | temporaries (XLA:CPU) | TFLOP/step/device |')
  print('|---|---|---|---|---|---|---|---|')
  for model_name in args.models.split(','):
    for name, mesh in STRATEGIES:
      with contextlib.redirect_stdout(sys.stderr):  # the per-run report goes to stderr
        report = loop.train_and_evaluate(
            config_for(model_name, args.batch_size, mesh, args.remat), '/nonexistent')
      shape = ' x '.join(str(v) for v in _resolved(mesh, jax.device_count()))
      print(f'| {model_name} | {name} ({shape}) | {report["param_bytes"] / gib:.3f} | '
            f'{report["opt_state_bytes"] / gib:.3f} | '
            f'{(report["param_bytes"] + report["opt_state_bytes"]) / gib:.3f} | '
            f'{report["argument_bytes"] / gib:.3f} | {report["temp_bytes"] / gib:.3f} | '
            f'{report["flops"] / 1e12:.2f} |', flush=True)
  return 0


def _resolved(mesh: dict, devices: int):
  from vit_jax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  return mesh_lib.mesh_shape(ml_collections.ConfigDict(mesh), devices)


if __name__ == '__main__':
  sys.exit(main())
