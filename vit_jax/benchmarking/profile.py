"""Where a compiled step spends its time: a per-kernel profile grouped by model component.

`profile_step` runs the step under `jax.profiler.trace`, reads the Perfetto trace it writes (one
event per XLA:CPU kernel, named after the HLO instruction), and joins each event to the compiled
HLO: the instruction's `op_name` metadata says which module and phase it belongs to, and the dots
and convolutions inside it give its FLOPs. A fused kernel is filed under its root op (a matmul with
a fused bias add counts as the matmul). Rows: phase (forward, backward, optimizer and other) x
component (q/k/v projections, attention core, MLP, LayerNorm, ...), with ms per step, share of
kernel time, GFLOP per step and achieved GFLOP/s.
"""

import collections
import dataclasses
import glob
import gzip
import json
import math
import os
import re
import tempfile
from typing import Callable, Dict, List, Optional

import jax

_INSTR = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*\)|\S+) ([\w\-]+)\((.*)$')
_SHAPE = re.compile(r'^[a-z]+\d*\[([\d,]*)\]')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r'calls=%([\w.\-]+)')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%([\w.\-]+) .*\{\s*$')

# (component, pattern on the op_name path), first match wins.
COMPONENTS = (
    ('q/k/v projections', r'MultiHeadDotProductAttention_0/(query|key|value)/'),
    ('attention out projection', r'MultiHeadDotProductAttention_0/out/'),
    ('attention core (QK, softmax, AV)', r'MultiHeadDotProductAttention_0/'),
    ('MLP Dense_0', r'MlpBlock_0/Dense_0/'),
    ('MLP Dense_1', r'MlpBlock_0/Dense_1/'),
    ('GELU', r'MlpBlock_0/'),
    ('LayerNorm', r'LayerNorm|encoder_norm'),
    ('residual adds', r'encoderblock(_\d+)?/add'),  # unrolled or scanned
    ('ResNet stem', r'conv_root|gn_root|root_block|block\d+/unit\d+'),
    ('patch embedding', r'/embedding/'),
    ('position embedding, cls', r'posembed_input|/concatenate|/broadcast_in_dim'),
    ('head', r'/head/|pre_logits'),
)


@dataclasses.dataclass
class Instruction:
  opcode: str
  dims: Optional[List[int]]      # None for tuples
  op_name: str
  calls: List[str]
  operands: List[str]
  line: str


def parse_hlo(text: str) -> Dict[str, Instruction]:
  """Every instruction of an HLO module text by name (names are unique in a module)."""
  out = {}
  for line in text.splitlines():
    m = _INSTR.match(line)
    if not m:
      continue
    name, shape, opcode, rest = m.groups()
    dims = _SHAPE.match(shape)
    op_name = _OP_NAME.search(line)
    args = rest.split(')', 1)[0]
    out[name] = Instruction(
        opcode=opcode, dims=[int(d) for d in dims.group(1).split(',') if d] if dims else None,
        op_name=op_name.group(1) if op_name else '', calls=_CALLS.findall(line),
        operands=re.findall(r'%([\w.\-]+)', args), line=line)
  return out


def computations(text: str) -> Dict[str, List[str]]:
  """Instruction names of each computation, by computation name."""
  out, current = {}, None
  for line in text.splitlines():
    m = _COMPUTATION.match(line)
    if m and ' = ' not in line.split('{')[0]:
      current = out.setdefault(m.group(1), [])
      continue
    if current is not None:
      i = _INSTR.match(line)
      if i:
        current.append(i.group(1))
  return out


def _size(dims: Optional[List[int]]) -> int:
  return math.prod(dims) if dims else 0


def instruction_flops(name: str, instrs: Dict[str, Instruction]) -> float:
  """Multiply-add FLOPs (x2) of a dot or convolution; 0 for anything else."""
  ins = instrs[name]
  if ins.opcode == 'dot' and ins.operands:
    lhs = instrs.get(ins.operands[0])
    m = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', ins.line)
    if lhs is None or lhs.dims is None or not m:
      return 0.
    k = math.prod(lhs.dims[int(d)] for d in m.group(1).split(',') if d)
    return 2. * _size(ins.dims) * k
  if ins.opcode == 'convolution' and len(ins.operands) > 1:
    rhs = instrs.get(ins.operands[1])
    m = re.search(r'dim_labels=\w+_(\w+)->', ins.line)
    if rhs is None or rhs.dims is None or not m or 'o' not in m.group(1):
      return 0.
    out_features = rhs.dims[m.group(1).index('o')]
    return 2. * _size(ins.dims) * _size(rhs.dims) / max(out_features, 1)
  return 0.


def kernel_flops(name: str, instrs: Dict[str, Instruction],
                 comps: Dict[str, List[str]]) -> float:
  """FLOPs of a top-level kernel: its own dot/conv, or those of the computations it calls."""
  total, todo, seen = instruction_flops(name, instrs), list(instrs[name].calls), set()
  while todo:
    comp = todo.pop()
    if comp in seen:
      continue
    seen.add(comp)
    for inner in comps.get(comp, []):
      total += instruction_flops(inner, instrs)
      todo.extend(instrs[inner].calls)
  return total


def classify(op_name: str) -> tuple:
  """(phase, component) of an HLO op_name such as
  'jit(train_step)/transpose(jvp(VisionTransformer))/Transformer/encoderblock_3/MlpBlock_0/...'."""
  if 'transpose(jvp(' in op_name:
    phase = 'backward'
  elif 'VisionTransformer' in op_name or 'ResNet' in op_name:
    phase = 'forward'
  else:
    return 'optimizer, loss, other', '-'
  for component, pattern in COMPONENTS:
    if re.search(pattern, op_name):
      return phase, component
  return phase, 'other'


def read_trace(trace_dir: str) -> List[dict]:
  files = sorted(glob.glob(os.path.join(trace_dir, 'plugins', 'profile', '*',
                                        'perfetto_trace.json.gz')))
  if not files:
    raise RuntimeError(f'jax.profiler wrote no Perfetto trace under {trace_dir}')
  with gzip.open(files[-1], 'rt') as f:
    data = json.load(f)
  return data['traceEvents'] if isinstance(data, dict) else data


def summarize(events: List[dict], hlo_text: str, steps: int) -> dict:
  """Kernel events joined to the HLO, grouped by (phase, component); times per step."""
  instrs, comps = parse_hlo(hlo_text), computations(hlo_text)
  ms, flops, kernels = (collections.defaultdict(float), collections.defaultdict(float),
                        collections.defaultdict(set))
  for e in events:
    name = e.get('name')
    if e.get('ph') != 'X' or name not in instrs:
      continue
    key = classify(instrs[name].op_name)
    ms[key] += e.get('dur', 0.) / 1e3 / steps
    kernels[key].add(name)
  for key, names in kernels.items():
    flops[key] = sum(kernel_flops(n, instrs, comps) for n in names)
  total = sum(ms.values())
  rows = [{'phase': p, 'component': c, 'ms_per_step': t, 'share': t / total if total else 0.,
           'kernels': len(kernels[(p, c)]), 'gflop_per_step': flops[(p, c)] / 1e9,
           'gflop_per_s': flops[(p, c)] / 1e6 / t if t else 0.}
          for (p, c), t in sorted(ms.items(), key=lambda kv: -kv[1])]
  return {'kernel_ms_per_step': total, 'rows': rows}


def profile_step(step: Callable[[], object], hlo_text: str, steps: int = 2) -> dict:
  """Runs `step` `steps` times under the JAX profiler; the per-component summary."""
  jax.block_until_ready(step())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        jax.block_until_ready(step())
    return summarize(read_trace(trace_dir), hlo_text, steps)


def format_profile(profile: dict, wall_ms: Optional[float] = None) -> str:
  head = f'  kernel time {profile["kernel_ms_per_step"]:.1f} ms/step'
  if wall_ms:
    head += f' (step wall time {wall_ms:.1f} ms)'
  lines = [head, '  | phase | component | ms/step | share | GFLOP/step | GFLOP/s |',
           '  |---|---|---|---|---|---|']
  for r in profile['rows']:
    rate = f'{r["gflop_per_s"]:.1f}' if r['gflop_per_step'] else '-'
    lines.append(f'  | {r["phase"]} | {r["component"]} | {r["ms_per_step"]:.1f} | '
                 f'{100 * r["share"]:.1f}% | {r["gflop_per_step"]:.2f} | {rate} |')
  return '\n'.join(lines)


__all__ = ['profile_step', 'summarize', 'format_profile', 'classify', 'parse_hlo',
           'kernel_flops']
