"""What the compiled train and eval steps need on each device, without running them (compile-only).

The compiler's memory analysis of the per-device program gives argument bytes (train state shard
+ batch shard + rng), output bytes, bytes aliased between them (the donated state) and temporary
bytes (activations kept for the backward pass, gradients, workspace). Peak is the compiler's own
figure where it gives one (the TPU compiler), else arguments + outputs - aliased + temporaries.
The state bytes per device are also computed from the shardings directly (parameters and
optimizer state separately), as a cross-check.

Whose figures: compiled for a TPU slice or a GPU (`config.compile_for`,
vit_jax/platform/targets.py), they are the TPU compiler's or XLA:GPU's (without autotuning).
Compiled for CPU devices they are XLA:CPU's, which do not carry over to a TPU: XLA:CPU's
scheduler does not lower memory by rematerialisation and it computes bfloat16 in float32
(ViT-H/14 at 518 px, 2 images per core: 36.2 GiB by XLA:CPU as first measured, 13.8 GiB by the
TPU v3 compiler; docs/scaling.md, "Planning for TPUs"). The report says which compiler made it.
"""

import contextlib
import re
import time
from typing import Any, Callable, Dict, Optional

import jax
from jax.experimental.compilation_cache import compilation_cache

from vit_jax.errors import UserError
from vit_jax.parallel import sharding as sharding_lib
from vit_jax.platform import chips
from vit_jax.platform import estimate as estimate_lib
from vit_jax.platform import targets

GIB = 2 ** 30
CPU_CAVEAT = ("XLA:CPU's figures, not a TPU's: XLA:CPU does not lower memory by "
              "rematerialisation and computes bfloat16 in float32, so TPU memory can be several "
              "times lower; compile for the slice with config.compile_for=v3-8 (or another "
              "slice) for the TPU compiler's figures")

MEMORY_FIXES = ('config.model.remat=full, config.model.dtype=bfloat16, config.mesh.fsdp=-1, '
                'a smaller per-device batch (more devices, or config.accum_steps) or a larger '
                'slice')


@contextlib.contextmanager
def _persistent_cache_off():
  """For programs compiled for devices this process cannot run (a TPU slice described by the TPU
  compiler): JAX would write them to the persistent cache, then fail to read them back."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  compilation_cache.reset_cache()  # JAX decides once per process whether the cache is used
  try:
    yield
  finally:
    jax.config.update('jax_enable_compilation_cache', enabled)
    compilation_cache.reset_cache()


def _compile(lowerable: Callable[[], Any], options: Optional[dict]) -> tuple:
  """(compiled, seconds): lowers and compiles with the XLA `options`, timing both."""
  start = time.perf_counter()
  compiled = lowerable().compile(compiler_options=options)
  return compiled, time.perf_counter() - start


def step_stats(compiled, seconds: float) -> Dict[str, Any]:
  """Per-device bytes, FLOPs and compile time of one compiled program, and where its compiler
  has a cost model (the TPU compiler) its lower bound in seconds and the custom calls it leaves
  uncosted (vit_jax/platform/estimate.py)."""
  stats = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per program
    cost = cost[0] if cost else {}
  args, out = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
  alias, temp = int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes)
  own_peak = int(getattr(stats, 'peak_memory_in_bytes', 0) or 0)
  return {
      'argument_bytes': args,
      'output_bytes': out,
      'alias_bytes': alias,
      'temp_bytes': temp,
      'code_bytes': int(stats.generated_code_size_in_bytes),
      'peak_bytes': max(own_peak, args + out - alias + temp),
      'flops': float(cost.get('flops', 0.0)),
      'bytes_accessed': float(cost.get('bytes accessed', 0.0)),
      'optimal_seconds': float(cost['optimal_seconds']) if cost.get('optimal_seconds') else None,
      'custom_calls': estimate_lib.custom_calls(compiled) if cost.get('optimal_seconds') else 0,
      'concat_bitcasts': (estimate_lib.concat_bitcasts(compiled) if cost.get('optimal_seconds')
                          else 0),
      'compile_seconds': seconds,
  }


_OUT_OF_HBM = re.compile(r'required for (.+?) \(([\d.]+\s*[KMGT]?)\) exceeds available HBM '
                         r'\(([\d.]+\s*[KMGT]?)\)')


def _out_of_memory(error: Exception, what: str, devices) -> Optional[UserError]:
  """The one-line UserError for the TPU compiler's RESOURCE_EXHAUSTED, or None for other errors."""
  text = ' '.join(str(error).split())
  if 'RESOURCE_EXHAUSTED' not in text:
    return None
  match = _OUT_OF_HBM.search(text)
  need = (f'{match.group(2)}B for {match.group(1)} where {match.group(3)}B is available'
          if match else text[:200])
  return UserError(f'does not fit: {what} on {chips.describe_devices(devices)}: the TPU '
                   f'compiler ran out of HBM ({need} per device); try {MEMORY_FIXES}')


def program_report(prog) -> Dict[str, Any]:
  """Compiles `prog`'s train and eval steps for its mesh; per-device bytes, FLOPs, times.

  Top-level byte/FLOP keys are the train step's; `eval` holds the eval step's.
  """
  devices = list(prog.mesh.devices.flat)
  options = targets.compiler_options(prog.target)
  try:
    with contextlib.nullcontext() if prog.target is None else _persistent_cache_off():
      train, train_s = _compile(lambda: prog.train_fn.lower(*prog.abstract_train_args()),
                                options)
      evaluate, eval_s = _compile(lambda: prog.eval_fn.lower(prog.abstract_state.params,
                                                             prog.abstract_eval_batch()), options)
  except Exception as e:  # pylint: disable=broad-except  # only out-of-memory is the user's
    error = _out_of_memory(e, prog.describe(), devices)
    if error is None:
      raise
    raise error from None
  report = step_stats(train, train_s)
  report.update(
      devices=len(devices), device_kind=chips.describe_devices(devices),
      platform=devices[0].platform, hbm_bytes=chips.hbm_bytes(devices),
      param_bytes=sharding_lib.state_bytes_per_device(prog.abstract_state.params,
                                                      prog.state_shardings.params),
      opt_state_bytes=sharding_lib.state_bytes_per_device(prog.abstract_state.opt_state,
                                                          prog.state_shardings.opt_state),
      eval=step_stats(evaluate, eval_s))
  return report


def fits(report: Dict[str, Any]) -> Optional[bool]:
  """Whether the larger of the two steps' peaks fits the device's memory (None: a CPU)."""
  if report.get('hbm_bytes') is None:
    return None
  return max(report['peak_bytes'], report['eval']['peak_bytes']) <= report['hbm_bytes']


def fit_line(report: Dict[str, Any]) -> str:
  hbm = report['hbm_bytes'] / GIB
  peak = max(report['peak_bytes'], report['eval']['peak_bytes']) / GIB
  if fits(report):
    return (f'fits: peak {peak:.2f} GiB of the {hbm:.4g} GiB HBM per device ({hbm - peak:.2f} GiB '
            'spare)')
  return (f'does not fit: peak {peak:.2f} GiB exceeds the {hbm:.4g} GiB HBM per device by '
          f'{peak - hbm:.2f} GiB')


# Why XLA's FLOP count is left out (`Program.memory_report` sets `flops_missing`).
FLOPS_MISSING = {
    'scan': "XLA counts a scanned encoder's loop once; config.model.scan=False counts them",
    'gpu': "XLA:GPU's cost analysis does not see the cuBLAS and cuDNN calls",
}


def _flops_text(report: Dict[str, Any]) -> str:
  if report['flops'] is None:
    return f'FLOPs not counted ({FLOPS_MISSING[report["flops_missing"]]})'
  return f'{report["flops"] / 1e12:.3f} TFLOP per train step per device'


def _estimate_lines(report: Dict[str, Any]) -> list:
  """The TPU compiler's estimated step times (`Program.estimate`), as report lines."""
  found = report.get('estimate')
  if not found:
    return []
  if 'missing' in found:
    return [f'  estimated step time: none ({FLOPS_MISSING[found["missing"]]})']
  steps = [estimate_lib.describe(found[k], f'{k} step') for k in ('train', 'eval') if found[k]]
  if not steps:
    return ["  estimated step time: none (the TPU compiler's cost model gave no time, or a "
            "negative one where it could not cost some ops, for this program)"]
  lines = ["  estimated by the TPU compiler's cost model (a lower bound): " + ', '.join(steps)]
  if 'run_seconds' in found:
    lines.append(f'  estimated run: {found["steps"]:,} train steps x '
                 f'{estimate_lib.duration(found["train"]["seconds"])} = '
                 f'{estimate_lib.duration(found["run_seconds"])} of train steps (evaluation not '
                 'included)')
  for name in ('train', 'eval'):
    step, est = (report if name == 'train' else report['eval']), found[name]
    if not est or not step.get('custom_calls'):
      continue
    if est['uncosted_flops']:
      lines.append(f'  note: the cost model does not cost the {step["custom_calls"]} Pallas calls '
                   f'(splash attention) of the {name} step: their attention matmuls, '
                   f'{estimate_lib.flop_count(est["uncosted_flops"])} per device counted from the '
                   "model's shapes, are added at the chip's peak")
    else:
      lines.append(f'  note: the cost model does not cost the {step["custom_calls"]} custom calls '
                   f'of the {name} step, and nothing here counts them: the {name} step takes '
                   'longer than its estimate')
  return lines


def format_report(report: Dict[str, Any], what: str) -> str:
  """A few readable lines (GiB per device)."""
  g = lambda key, r=report: r[key] / GIB
  ev = report['eval']
  target = report.get('target') or report['device_kind']
  compiler = ('the TPU compiler' if report['platform'] == 'tpu'
              else f'XLA:{report["platform"].upper()}')
  lines = [
      f'compile-only: {what}',
      f'  compiled by {compiler} for {target}',
      f'  per device: parameters {g("param_bytes"):.3f} GiB + optimizer state '
      f'{g("opt_state_bytes"):.3f} GiB',
      f'  train step, per device: arguments {g("argument_bytes"):.3f} GiB, outputs '
      f'{g("output_bytes"):.3f} GiB (of which {g("alias_bytes"):.3f} GiB reuse the donated '
      f'state), temporaries {g("temp_bytes"):.3f} GiB',
      f'  peak per device: train step {g("peak_bytes"):.3f} GiB, eval step '
      f'{g("peak_bytes", ev):.3f} GiB; {_flops_text(report)}',
      f'  compile time: train step {report["compile_seconds"]:.1f} s, eval step '
      f'{ev["compile_seconds"]:.1f} s',
  ]
  lines += _estimate_lines(report)
  if report['hbm_bytes'] is not None:
    lines.append('  ' + fit_line(report))
  elif report['platform'] == 'cpu':
    lines.append(f'  note: {CPU_CAVEAT}')
  return '\n'.join(lines)


__all__ = ['MEMORY_FIXES', 'program_report', 'step_stats', 'fits', 'fit_line', 'format_report', 'CPU_CAVEAT']
