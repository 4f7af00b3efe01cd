"""Benchmark: `python -m vit_jax bench --model=ViT-B/16 --batch_size=8 --image_size=224 --mode=train`.

The output names the processor first (model name, family/model, vector extensions; `processor` in
--json; vit_jax/platform/cpus.py). Modes: train (the trainer's jitted train step: forward,
backward, Adam), infer (the forward pass), input (the train input pipeline with the config's train
preprocessing, on synthetic JPEGs of --input_size px or on mnist5k). Reported after warm-up:
img/s (median of --steps device-synchronised steps), compile_s (start to first result),
flops_per_img (XLA cost analysis), achieved_flops, matmul_peak_flops (a 2048^3 fp32 matmul timed
in the same run), utilization (achieved / peak), peak_bytes (compiled step: arguments + outputs - aliased + temporaries) and rss_peak_bytes.
--compare=timm times the same model, batch, resolution, dtype and optimizer in timm (PyTorch CPU)
alternately with ours and prints the ratio (needs `make test-interop`). --profile adds where the
time goes (vit_jax/tools/benchmarking/profile.py). --json: one JSON object.
The base config is --config (default: the package's mnist5k recipe, vit_jax/configs/mnist5k.py,
found from any working directory: no Polyak averaging or other extras of `make train`'s recipe,
so the step is the plain trainer's). The compute dtype is --dtype, else the config's
`model.dtype`; both given and different is refused.
--suite=gpu [--compare=timm] runs a fixed set of runs, each in its own process, and prints one
table (vit_jax/tools/benchmarking/suite.py); --suite_models, --suite_modes, --suite_sides and
--suite_only narrow it, --suite_xla adds XLA:GPU flag variants, --suite_timeout bounds each run,
--suite_dump keeps the compiled train steps' buffer assignments, --suite_profile adds where each
step's time goes by kernel class, ours against timm (one table per model and mode).
--compile_for=h100 (or h200) compiles our step for that GPU here, without one, and prints XLA's
memory analysis (`make gpu-compiler`; vit_jax/platform/targets.py).
"""

import json
import os
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups
from vit_jax.platform import targets

_CONFIG = flag_groups.config()
_MODEL = flag_groups.model()
_BATCH = flag_groups.batch_size()
_IMAGE = flag_groups.image_size()
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'infer', 'input'], 'What to time.')
_DTYPE = flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'], "Compute dtype (default: the "
                           "config's model.dtype, float32 in the default config).")
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps (median reported).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'With --compare: alternations of ours and theirs.')
_COMPARE = flags.DEFINE_enum('compare', None, ['timm'], 'Also time the same model in timm.')
_INPUT = flags.DEFINE_string('input_data', 'synthetic', "--mode=input: 'synthetic' (JPEGs made "
                             "once in --data_dir), 'archive' (the same JPEGs read in place from "
                             "a tar of tars against a folder of class folders, per core: "
                             "vit_jax/tools/benchmarking/input.py) or a prepared dataset name (e.g. "
                             "mnist5k).")
_INPUT_SIZE = flags.DEFINE_integer('input_size', 400, 'Side of the synthetic JPEGs (pixels).')
_DATA_DIR = flag_groups.data_dir()
_PROFILE = flags.DEFINE_bool('profile', False, 'Also print where the step spends its time: '
                             'our kernels per model component (and timm\'s ops with --compare).')
_JSON = flag_groups.json_output()
_COMPILE_FOR = flags.DEFINE_enum(
    'compile_for', None, list(targets.GPUS), 'Compile our step (--mode=train or infer) for this '
    'NVIDIA GPU on this machine, without one, and print its memory analysis (`make gpu-compiler` '
    'installs the compiler).')
_SUITE = flags.DEFINE_enum('suite', None, ['gpu', 'smoke'], 'Run a fixed set of benchmarks, each '
                           'in its own process, and print one table: gpu (ViT-Ti/16, B/16, L/16 '
                           'in bf16 on an NVIDIA GPU; with --compare=timm also timm eager and '
                           'compiled) or smoke (the same machinery on the CPU in seconds).')
_SUITE_MODELS = flags.DEFINE_list('suite_models', [], 'Only these models of the suite (B/16).')
_SUITE_MODES = flags.DEFINE_list('suite_modes', [], 'Only these modes (train, infer).')
_SUITE_SIDES = flags.DEFINE_list('suite_sides', [], 'Only these sides (ours-einsum, ours-cudnn, '
                                 'timm-eager, timm-compiled).')
_SUITE_ONLY = flags.DEFINE_list('suite_only', [], 'Only these run ids (B/16-train-ours-einsum).')
_SUITE_XLA = flags.DEFINE_list('suite_xla', [], 'XLA:GPU flag variants (vit_jax/platform/gpu.py) '
                               'to add one ours-einsum train run each for.')
_SUITE_DUMP = flags.DEFINE_string('suite_dump', None, 'Our train runs dump the compiled train '
                                   'step (HLO, buffer assignment, memory-usage report) into a '
                                   'folder per run of this directory.')
_SUITE_TIMEOUT = flags.DEFINE_integer('suite_timeout', 300, 'Seconds each suite run may take.')
_SUITE_PROFILE = flags.DEFINE_bool('suite_profile', False, 'Each suite run also profiles its '
                                   'step; prints ms per step by kernel class (GEMM, attention, '
                                   'LayerNorm, ...), ours against timm.')

# The base config when --config is not given: passed as if it were, so that its overrides
# (`--config.KEY=VALUE`) are parsed, and refused in one line, as the trainer's are. The package's
# own file, so that it is found from any working directory.
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              'configs', 'mnist5k.py')
# Shared flags (flag_groups.py): this command's defaults and meanings.
_ADAPTED = {
    'config': (None, 'Base config file (default: the mnist5k recipe, vit_jax/configs/mnist5k.py).'),
    'model': ('ViT-B/16', 'Variant, e.g. ViT-Ti/16 or R50+ViT-B/16.'),
    'batch_size': (8, 'Batch size.'),
    'image_size': (224, 'Input resolution (pixels).'),
    'data_dir': ('/tmp/vit_jax_benchmark_data', 'Where --mode=input finds or makes its data.'),
    'json': (False, 'Print one JSON object instead of text.'),
}


def compute_dtype(dtype_flag, config_dtype: str, argv) -> str:
  """The benchmark's compute dtype: --dtype, else the config's model.dtype; UserError when both
  are on the command line and differ."""
  if dtype_flag is None:
    return config_dtype
  if any(a.startswith('--config.model.dtype=') for a in argv) and config_dtype != dtype_flag:
    raise cli.UserError(f'--dtype={dtype_flag} and --config.model.dtype={config_dtype} disagree: '
                        f'pass one of them')
  return dtype_flag


def run_suite() -> int:
  from vit_jax.tools.benchmarking import suite  # pylint: disable=g-import-not-at-top
  runs = suite.plan(_SUITE.value, compare=_COMPARE.value, models=_SUITE_MODELS.value,
                    modes=_SUITE_MODES.value, sides=_SUITE_SIDES.value, only=_SUITE_ONLY.value,
                    xla=_SUITE_XLA.value)
  steps = _STEPS.value if flags.FLAGS['steps'].present else None
  rows = suite.run_suite(runs, _SUITE.value, timeout_s=_SUITE_TIMEOUT.value, steps=steps,
                         dump_to=_SUITE_DUMP.value, profile=_SUITE_PROFILE.value)
  table = suite.format_table(rows)
  if _SUITE_PROFILE.value:
    table += '\n\n' + suite.format_profile_tables(rows)
  if _JSON.value:  # the table on stderr, the rows on stdout
    print(table, file=sys.stderr, flush=True)
    print(json.dumps({'suite': _SUITE.value, 'rows': rows}, indent=1))
  else:
    print(table)
  return 0


def run_compile_for(dtype: str) -> int:
  if _MODE.value == 'input':
    raise cli.UserError('--compile_for compiles a step: use it with --mode=train or infer')
  targets.load_gpu_compiler()  # before JAX starts: cuDNN too where it is in the compiler's folder
  from vit_jax.tools.benchmarking import ours  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  ours.set_benchmark_values(config, _MODEL.value, _BATCH.value, _IMAGE.value, dtype)
  result = ours.compile_for(config, targets.parse(_COMPILE_FOR.value), _MODE.value)
  result.update(model=_MODEL.value, mode=_MODE.value, batch_size=_BATCH.value,
                image_size=_IMAGE.value, dtype=dtype, compile_for=_COMPILE_FOR.value)
  m = result['memory_analysis']
  if _JSON.value:
    print(json.dumps(result, indent=1))
  else:
    print(f'{_MODEL.value} {_MODE.value} batch {_BATCH.value} at {_IMAGE.value} px, '
          f'{dtype}, compiled for {result["device_kind"]} on this machine (no GPU: cuBLAS '
          f'GEMMs, no autotuning) in {result["compile_s"]:.0f} s:\n  peak {m["peak"] / 1e9:.2f} GB '
          f'= arguments {m["argument"] / 1e9:.2f} + outputs {m["output"] / 1e9:.2f} - aliased '
          f'{m["alias"] / 1e9:.2f} + temporaries {m["temp"] / 1e9:.2f} GB\n  library calls: ' +
          (', '.join(f'{k} {v}' for k, v in sorted(result['library_calls'].items())) or 'none'))
  return 0


def run(argv) -> int:
  del argv
  if _SUITE.value:
    return run_suite()
  dtype = compute_dtype(_DTYPE.value, str(_CONFIG.value.model.dtype), sys.argv)
  if _COMPILE_FOR.value:
    return run_compile_for(dtype)
  from vit_jax.tools.benchmarking import compare  # pylint: disable=g-import-not-at-top
  if _STEPS.value < 1 or _BATCH.value < 1:
    raise cli.UserError('--steps and --batch_size must be at least 1')
  if _PROFILE.value and _MODE.value == 'input':
    raise cli.UserError('--profile profiles a compiled step: use it with --mode=train or infer')
  if _MODE.value == 'input' and _INPUT.value == 'archive':
    from vit_jax.tools.benchmarking import input as input_bench  # pylint: disable=g-import-not-at-top
    result = input_bench.run(_DATA_DIR.value, batch_size=_BATCH.value, batches=_STEPS.value)
    print(json.dumps(result, indent=1) if _JSON.value else input_bench.format_result(result))
    return 0
  if _MODE.value == 'train':
    from vit_jax.tools.benchmarking import ours  # pylint: disable=g-import-not-at-top
    ours.set_benchmark_values(_CONFIG.value, _MODEL.value, _BATCH.value, _IMAGE.value, dtype)
  result = compare.run_benchmark(
      _CONFIG.value, model=_MODEL.value, batch_size=_BATCH.value, image_size=_IMAGE.value,
      mode=_MODE.value, dtype=dtype, steps=_STEPS.value, rounds=_ROUNDS.value,
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
  flags_given = sys.argv[1:sys.argv.index('--')] if '--' in sys.argv else sys.argv[1:]
  if not any(a == '--config' or a.startswith('--config=') for a in flags_given):
    sys.argv.insert(1, f'--config={DEFAULT_CONFIG}')
  cli.run_main(run, compilation_cache=False)  # it times cold compiles


if __name__ == '__main__':
  sys.exit(main())
