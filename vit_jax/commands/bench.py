"""Benchmark: `python -m vit_jax bench --model=ViT-B/16 --batch_size=8 --image_size=224 --mode=train`.

The output names the processor first (model name, family/model, vector extensions; `processor` in
--json; vit_jax/benchmarking/processor.py). Modes: train (the trainer's jitted train step: forward,
backward, Adam), infer (the forward pass), input (the train input pipeline with the config's train
preprocessing, on synthetic JPEGs of --input_size px or on mnist5k). Reported after warm-up:
img/s (median of --steps device-synchronised steps), compile_s (start to first result),
flops_per_img (XLA cost analysis), achieved_flops, matmul_peak_flops (a 2048^3 fp32 matmul timed
in the same run), utilization (achieved / peak), peak_bytes (compiled step: arguments + outputs - aliased + temporaries) and rss_peak_bytes.
--compare=timm times the same model, batch, resolution, dtype and optimizer in timm (PyTorch CPU)
alternately with ours and prints the ratio (needs `make test-interop`). --profile adds where the
time goes (vit_jax/benchmarking/profile.py). --json: one JSON object.
The base config is --config (default configs/mnist5k.py: no Polyak averaging or other extras of
`make train`'s recipe, so the step is the plain trainer's).
"""

import json
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_CONFIG = flag_groups.config()
_MODEL = flag_groups.model()
_BATCH = flag_groups.batch_size()
_IMAGE = flag_groups.image_size()
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'infer', 'input'], 'What to time.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps (median reported).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'With --compare: alternations of ours and theirs.')
_COMPARE = flags.DEFINE_enum('compare', None, ['timm'], 'Also time the same model in timm.')
_INPUT = flags.DEFINE_string('input_data', 'synthetic', "--mode=input: 'synthetic' (JPEGs made "
                             "once in --data_dir) or a prepared dataset name (e.g. mnist5k).")
_INPUT_SIZE = flags.DEFINE_integer('input_size', 400, 'Side of the synthetic JPEGs (pixels).')
_DATA_DIR = flag_groups.data_dir()
_PROFILE = flags.DEFINE_bool('profile', False, 'Also print where the step spends its time: '
                             'our kernels per model component (and timm\'s ops with --compare).')
_JSON = flag_groups.json_output()

# Shared flags (flag_groups.py): this command's defaults and meanings.
_ADAPTED = {
    'config': ('configs/mnist5k.py', 'Base config file.'),
    'model': ('ViT-B/16', 'Variant, e.g. ViT-Ti/16 or R50+ViT-B/16.'),
    'batch_size': (8, 'Batch size.'),
    'image_size': (224, 'Input resolution (pixels).'),
    'data_dir': ('/tmp/vit_jax_benchmark_data', 'Where --mode=input finds or makes its data.'),
    'json': (False, 'Print one JSON object instead of text.'),
}


def run(argv) -> int:
  del argv
  from vit_jax.benchmarking import compare  # pylint: disable=g-import-not-at-top
  if _STEPS.value < 1 or _BATCH.value < 1:
    raise cli.UserError('--steps and --batch_size must be at least 1')
  if _PROFILE.value and _MODE.value == 'input':
    raise cli.UserError('--profile profiles a compiled step: use it with --mode=train or infer')
  if _MODE.value == 'train':
    from vit_jax.benchmarking import ours  # pylint: disable=g-import-not-at-top
    ours.set_benchmark_values(_CONFIG.value, _MODEL.value, _BATCH.value, _IMAGE.value,
                              _DTYPE.value)
  result = compare.run_benchmark(
      _CONFIG.value, model=_MODEL.value, batch_size=_BATCH.value, image_size=_IMAGE.value,
      mode=_MODE.value, dtype=_DTYPE.value, steps=_STEPS.value, rounds=_ROUNDS.value,
      compare_with=_COMPARE.value, input_data=_INPUT.value, input_size=_INPUT_SIZE.value,
      data_dir=_DATA_DIR.value, profile=_PROFILE.value)
  if _JSON.value:
    print(json.dumps(result, indent=1))
  else:
    print(compare.format_result(result))
  return 0


def main():
  for name, (default, text) in _ADAPTED.items():
    flag_groups.adapt(name, default=default, help=text)
  cli.run_main(run, compilation_cache=False)  # it times cold compiles


if __name__ == '__main__':
  sys.exit(main())
