"""`bench --suite=gpu [--compare=timm]`: a fixed set of benchmark runs, each in its own process.

The plan (`plan`: which runs, `command`: each one's command line and XLA flags) and the table
(`row`, `format_table`) are pure functions; `run_suite` executes the plan one subprocess at a
time, so one failure, out-of-memory or timeout costs that run only: its row carries its one-line
reason. The parent process never starts JAX (on a GPU that would take the children's memory).

Sides: ours with one attention kernel (`ours-einsum`, `ours-cudnn`: `bench --json
--config.model.attention=K`) or, train only, a kernel and a remat policy (`ours-einsum:dots`:
`--config.model.remat=dots`, the saved activations cut to the Dense outputs) or fp8 dense layers
(`ours-cudnn+fp8`: `--config.model.fp8=true`), timm eager and timm with torch.compile
(`timm_side.gpu_benchmark`: bf16 autocast, fused AdamW, gradient clipping at 1.0). FLOPs are the
model's (`models.cost`) on both sides, so MFU compares like with like. Memory: ours, the compiled
step's peak (arguments + outputs + temporaries, XLA's memory analysis) and the device allocator's
peak; timm, torch.cuda.max_memory_allocated.

`profile=True` (`--suite_profile`) also profiles each run's step after timing it (ours:
`bench --profile`, timm: torch.profiler) and `format_profile_tables` prints, per model and mode,
the time per step by kernel class, ours against timm (vit_jax/tools/benchmarking/profile.py).
"""

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from vit_jax.errors import UserError
from vit_jax.platform import gpu

OURS, TIMM = 'ours', 'timm'


@dataclasses.dataclass(frozen=True)
class Suite:
  models: Tuple[Tuple[str, int], ...]  # (model, batch)
  modes: Tuple[str, ...]
  ours: Tuple[str, ...]                # our runs: an attention kernel, ':' a remat policy or
                                       # '+fp8' (both train only)
  timm: Tuple[str, ...]                # 'eager', 'compiled' (with --compare=timm)
  dtype: str
  image_size: int
  steps: int
  needs_gpu: bool
  device: str                          # where timm runs: 'cuda' or 'cpu'


SUITES: Dict[str, Suite] = {
    # The GPU comparison: ViT-Ti/16, B/16 and L/16 at 224 px in bf16.
    'gpu': Suite(models=(('ViT-Ti/16', 256), ('ViT-B/16', 256), ('ViT-L/16', 128)),
                 modes=('train', 'infer'),
                 ours=('einsum', 'cudnn', 'einsum:dots', 'cudnn:dots', 'cudnn+fp8'),
                 timm=('eager', 'compiled'), dtype='bfloat16', image_size=224, steps=20,
                 needs_gpu=True, device='cuda'),
    # The same machinery on any CPU in seconds (a cudnn row shows a failing run's line).
    'smoke': Suite(models=(('ViT-Ze/4', 8),), modes=('train', 'infer'),
                   ours=('einsum', 'cudnn', 'einsum+fp8'), timm=('eager',), dtype='float32',
                   image_size=28, steps=2, needs_gpu=False, device='cpu'),
}

# What jit names the trainer's train step (the module XLA dumps with --suite_dump).
TRAIN_STEP_MODULE = 'jit_wrapped'

COLUMNS = ('run', 'img/s', 'MFU', 'compiled peak GB', 'allocator peak GB', 'first result s',
           'vs timm compiled')


@dataclasses.dataclass(frozen=True)
class Run:
  model: str
  batch: int
  mode: str
  side: str        # 'ours' or 'timm'
  variant: str     # ours: the attention kernel[:remat policy][+fp8]; timm: 'eager' or 'compiled'
  xla: str = gpu.DEFAULT_VARIANT  # ours: the XLA:GPU flag variant (platform/gpu.py)

  @property
  def id(self) -> str:
    short = self.model.split('-', 1)[-1]
    xla = '' if self.xla == gpu.DEFAULT_VARIANT else f'+xla:{self.xla}'
    return f'{short}-{self.mode}-{self.side}-{self.variant}{xla}'


def _pick(values: Sequence[str], allowed: Sequence[str], what: str) -> Tuple[str, ...]:
  bad = [v for v in values if v not in allowed]
  if bad:
    raise UserError(f'unknown {what} {", ".join(bad)}: use some of {", ".join(allowed)}')
  return tuple(values)


def plan(suite: str, *, compare: Optional[str] = None, models: Sequence[str] = (),
         modes: Sequence[str] = (), sides: Sequence[str] = (), only: Sequence[str] = (),
         xla: Sequence[str] = ()) -> List[Run]:
  """The runs of `suite`, in order, narrowed by `models` ('B/16' or 'ViT-B/16'), `modes`,
  `sides` ('ours-einsum', 'timm-compiled', ...) and `only` (run ids); timm's runs only with
  `compare='timm'`. `xla` adds, after each ours-einsum train run, one run per XLA:GPU flag
  variant (id '...-ours-einsum+xla:NAME')."""
  if suite not in SUITES:
    raise UserError(f'unknown --suite={suite}: use one of {", ".join(SUITES)}')
  s = SUITES[suite]
  names = [m for m, _ in s.models]
  wanted = {m if m in names else f'ViT-{m}' for m in models}
  _pick(sorted(wanted), names, '--suite_models')
  _pick(modes, s.modes, '--suite_modes')
  all_sides = [f'{OURS}-{k}' for k in s.ours] + [f'{TIMM}-{k}' for k in s.timm]
  _pick(sides, all_sides, '--suite_sides')
  _pick(xla, [v for v in gpu.XLA_GPU_FLAGS if v != gpu.DEFAULT_VARIANT], '--suite_xla')
  runs = []
  for model, batch in s.models:
    for mode in s.modes:
      candidates = []
      for k in s.ours:
        if (':' in k or '+' in k) and mode != 'train':  # remat and fp8: the train step only
          continue
        candidates.append(Run(model, batch, mode, OURS, k))
        if k == 'einsum' and mode == 'train':
          candidates += [Run(model, batch, mode, OURS, k, xla=v) for v in xla]
      if compare == 'timm':
        candidates += [Run(model, batch, mode, TIMM, k) for k in s.timm]
      runs += [r for r in candidates if not (
          (wanted and model not in wanted) or (modes and mode not in modes) or
          (sides and f'{r.side}-{r.variant}' not in sides) or (only and r.id not in only))]
  if only:
    every = plan(suite, compare='timm', xla=[v for v in gpu.XLA_GPU_FLAGS
                                             if v != gpu.DEFAULT_VARIANT])
    _pick(only, [r.id for r in every], '--suite_only')
  if not runs:
    raise UserError('the --suite_* filters leave no run: widen them (without --compare=timm the '
                    'suite has no timm runs)')
  return runs


def command(run: Run, suite: str, *, steps: Optional[int] = None, dump_to: Optional[str] = None,
            profile: bool = False, python: str = sys.executable
            ) -> Tuple[List[str], Dict[str, str]]:
  """(argv, environment additions) of one run's subprocess. `dump_to`: our train runs dump the
  train step's HLO, buffer assignment and memory-usage report (XLA_FLAGS) into a folder of that
  directory named after the run. `profile`: the run also profiles its step."""
  s = SUITES[suite]
  steps = steps or s.steps
  if run.side == OURS:
    options, _, fp8 = run.variant.partition('+')
    kernel, _, remat = options.partition(':')
    argv = [python, '-m', 'vit_jax', 'bench', f'--model={run.model}',
            f'--batch_size={run.batch}', f'--image_size={s.image_size}', f'--mode={run.mode}',
            f'--dtype={s.dtype}', f'--steps={steps}', '--json',
            f'--config.model.attention={kernel}']
    argv += [f'--config.model.remat={remat}'] if remat else []
    argv += ['--config.model.fp8=true'] if fp8 else []
    argv += ['--profile'] if profile else []
    flags = gpu.variant_flags(run.xla)
    if dump_to and run.mode == 'train':
      folder = os.path.join(dump_to, run.id.replace('/', '_').replace(':', '_'))
      flags += (f'--xla_dump_to={folder}', '--xla_dump_hlo_as_text',
                f'--xla_dump_hlo_module_re={TRAIN_STEP_MODULE}')
    joined = ' '.join([os.environ.get('XLA_FLAGS', ''), *flags]).strip()
    env = {'XLA_FLAGS': joined} if flags else {}
    return argv, env
  spec = dict(model=run.model, batch_size=run.batch, image_size=s.image_size, mode=run.mode,
              compiled=run.variant == 'compiled', steps=steps, device=s.device, dtype=s.dtype)
  if profile:
    spec['profile'] = True
  # JAX (imported for the FLOP count) stays off the GPU: it would take 75% of its memory.
  return ([python, '-m', 'vit_jax.tools.benchmarking.timm_side', json.dumps(spec)],
          {'JAX_PLATFORMS': 'cpu'})


def row(run: Run, result: Optional[dict], reason: Optional[str] = None) -> dict:
  """One table row from a run's JSON result (ours: the bench's; timm: `gpu_benchmark`'s), or its
  one-line failure `reason`."""
  out = {'id': run.id, 'model': run.model, 'batch_size': run.batch, 'mode': run.mode,
         'side': run.side, 'variant': run.variant, 'xla': run.xla, 'ok': result is not None,
         'reason': reason}
  if result is None:
    return out
  if result.get('profile'):
    out['profile'] = result['profile']
    out['step_ms'] = 1e3 * statistics.median(result['step_s_all'])
  out['versions'] = result.get('versions')
  if run.side == OURS:
    out.update(img_per_s=result['img_per_s'], mfu=result.get('mfu'),
               compiled_peak_bytes=result.get('peak_bytes'),
               allocator_peak_bytes=result.get('device_peak_bytes') or None,
               first_result_s=result['compile_s'], device=result.get('device_kind'),
               flops_per_img=result.get('flops_per_img'),
               memory_analysis=result.get('memory_analysis'))
  else:
    out.update(img_per_s=result['img_per_s'], mfu=result.get('mfu'), compiled_peak_bytes=None,
               allocator_peak_bytes=result.get('peak_bytes'),
               first_result_s=result['first_s'], device=result.get('device_name'),
               flops_per_img=result.get('flops_per_img'))
  return out


def _cell(value, fmt: str) -> str:
  return '-' if value is None else format(value, fmt)


def format_table(rows: Sequence[dict]) -> str:
  """A markdown table of `rows` (`COLUMNS`), headed by the device and the versions of each side's
  stack; ratios against the timm compiled run of the same model and mode where there is one."""
  devices = sorted({r['device'] for r in rows if r.get('device')})
  reference = {(r['model'], r['mode']): r['img_per_s'] for r in rows
               if r['ok'] and r['side'] == TIMM and r['variant'] == 'compiled'}
  stacks = sorted({', '.join(f'{k} {v}' for k, v in r['versions'].items())
                   for r in rows if r.get('versions')})
  versions = f' ({"; ".join(stacks)})' if stacks else ''
  lines = [f'on {", ".join(devices) or "(no run finished)"}{versions}:', '',
           '| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  for r in rows:
    if not r['ok']:
      lines.append(f'| {r["id"]} | failed: {r["reason"]} |' + ' |' * (len(COLUMNS) - 2))
      continue
    ref = reference.get((r['model'], r['mode']))
    cells = [r['id'], f'{r["img_per_s"]:,.0f}', _cell(r['mfu'] and 100 * r['mfu'], '.1f') +
             ('%' if r['mfu'] else ''),
             _cell(r['compiled_peak_bytes'] and r['compiled_peak_bytes'] / 1e9, '.1f'),
             _cell(r['allocator_peak_bytes'] and r['allocator_peak_bytes'] / 1e9, '.1f'),
             f'{r["first_result_s"]:.1f}', _cell(ref and r['img_per_s'] / ref, '.2f')]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def format_profile_tables(rows: Sequence[dict]) -> str:
  """Per model and mode, the kernel-class table (`profile.format_class_table`) of the rows that
  profiled their step, ours first and timm compiled last (the difference column is the first
  run's minus timm compiled's), with each run's measured step time below."""
  from vit_jax.tools.benchmarking import profile  # pylint: disable=g-import-not-at-top
  order = lambda r: (r['side'] == TIMM, r['side'] == TIMM and r['variant'] == 'compiled')
  out = []
  for key in dict.fromkeys((r['model'], r['mode']) for r in rows if r.get('profile')):
    group = sorted((r for r in rows if (r['model'], r['mode']) == key and r.get('profile')),
                   key=order)
    title = f'{key[0]} {key[1]}, batch {group[0]["batch_size"]}: ms per step by kernel class'
    table = profile.format_class_table([(r['id'], r['profile']) for r in group], title)
    out.append(table + '\nstep wall time (median, ms): ' + ', '.join(
        f'{r["id"]} {r["step_ms"]:.2f}' for r in group))
  return '\n\n'.join(out)


def _one_line(stderr: str) -> str:
  """The line that says why a run failed: its last `error:` line, else its last line."""
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith('error:') or 'Error' in l.split(':')[0]]
  line = (errors or lines or ['exited without output'])[-1]
  return line if len(line) <= 200 else line[:197] + '...'


def execute(argv: List[str], env: Dict[str, str], timeout_s: float) -> Tuple[Optional[dict], str]:
  """Runs one subprocess (its own process group, killed whole after `timeout_s`): (its JSON
  result, '') or (None, the one-line reason)."""
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **env}, start_new_session=True)
  try:
    out, err = proc.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return None, f'timed out after {timeout_s:.0f} s (--suite_timeout)'
  if proc.returncode != 0:
    return None, f'exit {proc.returncode}: {_one_line(err)}'
  try:
    return json.loads(out[out.index('{'):]), ''
  except ValueError:
    return None, f'no JSON result: {_one_line(err or out)}'


def run_suite(runs: Sequence[Run], suite: str, *, timeout_s: float, steps: Optional[int] = None,
              dump_to: Optional[str] = None, profile: bool = False, log=sys.stderr
              ) -> List[dict]:
  """Executes `runs` one after the other (each profiling its step with `profile`); prints each
  row's progress to `log`."""
  s = SUITES[suite]
  if s.needs_gpu and not gpu.nvidia_gpu_present():
    raise UserError(f'--suite={suite} times on an NVIDIA GPU and this machine has none (no '
                    f'nvidia-smi, no {gpu.DRIVER_PROC}): run --suite=smoke to try the suite here')
  if s.needs_gpu and not gpu.cuda_jax_installed():
    print(f'note: no CUDA build of JAX found here (`{gpu.INSTALL_COMMAND}` installs it); our '
          'runs may run on the CPU', file=log, flush=True)
  rows = []
  for i, r in enumerate(runs):
    argv, env = command(r, suite, steps=steps, dump_to=dump_to, profile=profile)
    start = time.perf_counter()
    result, reason = execute(argv, env, timeout_s)
    rows.append(row(r, result, reason or None))
    status = f'{result["img_per_s"]:,.0f} img/s' if result else reason
    print(f'[{i + 1}/{len(runs)}] {r.id}: {status} ({time.perf_counter() - start:.0f} s)',
          file=log, flush=True)
  return rows


__all__ = ['SUITES', 'COLUMNS', 'Run', 'plan', 'command', 'row', 'format_table',
           'format_profile_tables', 'execute', 'run_suite']
