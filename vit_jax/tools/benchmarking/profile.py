"""Where a compiled step spends its time: a per-kernel profile grouped by model component and by
kernel class.

`profile_step` runs the step under `jax.profiler.trace`, reads the Perfetto trace it writes and
joins each kernel event to the compiled HLO (`kernel_events`: on XLA:CPU one event per kernel,
named after its HLO instruction; on a GPU the device's 'XLA Ops' line, named after HLO
instructions, or else its streams' kernels, named by cuBLAS, cuDNN and XLA). The instruction's
`op_name` metadata says which module and phase it belongs to, and the dots and convolutions
inside it give its FLOPs. A fused kernel is filed under its root op (a matmul with a fused bias
add counts as the matmul). Rows: phase (forward, backward, optimizer and other) x component (q/k/v
projections, attention core, MLP, LayerNorm, ...), with ms per step, share of kernel time, GFLOP
per step and achieved GFLOP/s.

Kernel classes (`KERNEL_CLASSES`: GEMMs, attention, LayerNorm, elementwise, softmax, optimizer,
copies and transposes, padding) compare two implementations of the same step, ours against
timm's (vit_jax/tools/benchmarking/timm_side.py): `hlo_kernel_class` files our kernels by their HLO,
`kernel_class` any kernel by its name alone (cuBLAS/CUTLASS GEMMs, cuDNN and flash attention,
torch.compile's Triton kernels, XLA's fusions, ATen ops), `class_table` lines them up. The
attention core (QK, softmax, AV, whatever kernels run it) counts as attention on both sides, so a
fused attention kernel compares with its unfused form; data movement alone (transposes, copies,
concatenations) is copies wherever it sits, and padding is its own class.
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
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import jax

_INSTR = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*\)|\S+) ([\w\-]+)\((.*)$')
_SHAPE = re.compile(r'^[a-z]+\d*\[([\d,]*)\]')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r'calls=%([\w.\-]+)')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%([\w.\-]+) .*\{\s*$')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')

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


# Kernel classes of the comparison with timm, in table order.
KERNEL_CLASSES = ('GEMM', 'attention', 'LayerNorm', 'GELU and other elementwise', 'softmax',
                  'optimizer', 'copies/transposes', 'padding', 'other')

# (class, pattern on a lower-cased kernel or op name), first match wins. The names: cuBLAS
# (sm90_xmma_gemm_*, nvjet_*, cublasLt), CUTLASS, cuDNN fused attention (cudnn_generated_*sdpa*),
# flash attention (flash_fwd_kernel, fmha_cutlassF), PyTorch's CUDA kernels
# (vectorized_layer_norm_kernel, FusedAdamMathFunctor in multi_tensor_apply_kernel), Triton
# kernels of torch.compile (triton_poi_fused_gelu_*, triton_red_fused_native_layer_norm_*,
# triton_tem_fused_addmm_*), XLA:GPU fusions (loop_transpose_fusion, gemm_fusion_dot,
# loop_pad_fusion) and ATen ops on a CPU (aten::addmm, aten::native_layer_norm).
NAME_CLASSES: Tuple[Tuple[str, str], ...] = (
    ('attention', r'flash|fmha|sdpa|scaled_dot_product|attention|(^|[^a-z])mha'),
    ('optimizer', r'adam|sgd|optimizer|multi_tensor_apply|foreach|lpnorm|clip_grad'),
    ('LayerNorm', r'layer_?norm|gammabetabackward'),
    ('softmax', r'softmax'),
    ('padding', r'constant_pad|(^|[^a-z])pad([^a-z]|$)'),
    ('GEMM', r'gemm|xmma|nvjet|cutlass|cublas|wgmma|matmul|convolution|(^|[^a-z])(mm|addmm|bmm|'
             r'baddbmm|linear|dot)([^a-z]|$)'),
    # (torch.compile's `_to_copy` is a dtype conversion: elementwise, as XLA's convert.)
    ('copies/transposes', r'(?<!to_)copy|memcpy|memset|transpose|concat|(^|[^a-z])cat([^a-z]|$)|'
                          r'slice|permute|clone|contiguous|gather|scatter|bitcast'),
    ('GELU and other elementwise', r'gelu|tanh|erf|elementwise|fusion|triton_(poi|red|per)_|'
                                   r'add|mul|div|sub|exp|reduce|where|select|dropout|bernoulli|'
                                   r'fill|zero|neg|sqrt|pow|mean|sum|relu|convert|to_copy'),
)

# HLO opcodes that only move data: a kernel made of nothing else is a copy (or padding).
_MOVES = frozenset({
    'parameter', 'constant', 'copy', 'transpose', 'bitcast', 'reshape', 'broadcast', 'slice',
    'dynamic-slice', 'dynamic-update-slice', 'concatenate', 'pad', 'gather', 'scatter', 'tuple',
    'get-tuple-element', 'copy-start', 'copy-done', 'iota'})
# Custom-call targets: cuBLAS/cuBLASLt GEMMs (fp8 included), cuDNN fused attention, TPU kernels.
_GEMM_TARGETS = re.compile(r'cublas|gemm|matmul', re.I)
_ATTENTION_TARGETS = re.compile(r'fmha|flash|splash|attention', re.I)


@dataclasses.dataclass
class Instruction:
  opcode: str
  dims: Optional[List[int]]      # None for tuples
  op_name: str
  calls: List[str]
  operands: List[str]
  line: str

  @property
  def target(self) -> str:
    """The custom-call target ('__cublas$gemm'), '' for other instructions."""
    m = _TARGET.search(self.line)
    return m.group(1) if m else ''


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


def _called(name: str, instrs: Dict[str, Instruction],
            comps: Dict[str, List[str]]) -> List[str]:
  """`name` and every instruction of the computations it calls, transitively."""
  out, todo, seen = [name], list(instrs[name].calls), set()
  while todo:
    comp = todo.pop()
    if comp in seen:
      continue
    seen.add(comp)
    for inner in comps.get(comp, []):
      out.append(inner)
      todo.extend(instrs[inner].calls)
  return out


def kernel_flops(name: str, instrs: Dict[str, Instruction],
                 comps: Dict[str, List[str]]) -> float:
  """FLOPs of a top-level kernel: its own dot/conv, or those of the computations it calls."""
  return sum(instruction_flops(n, instrs) for n in _called(name, instrs, comps))


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


def _name_class(name: str) -> str:
  lowered = name.lower()
  for cls, pattern in NAME_CLASSES:
    if re.search(pattern, lowered):
      return cls
  return 'other'


# Classes an enclosing op gives the kernels it launches (the first found, outermost first).
_CONTEXT_CLASSES = ('optimizer', 'attention', 'LayerNorm', 'softmax')


def kernel_class(name: str, context: Sequence[str] = ()) -> str:
  """The `KERNEL_CLASSES` entry of a kernel or op known by its name (`NAME_CLASSES`) and the
  names of the ops that launched it, outermost first (PyTorch's profiler records them: an Adam
  step's elementwise kernels are the optimizer's, a LayerNorm backward's reductions LayerNorm's).
  Inside an optimizer step everything is the optimizer's; inside attention everything but data
  movement is attention (as our attention core); elsewhere an enclosing op names only kernels
  whose own name says nothing more than elementwise."""
  own = _name_class(name)
  outer = next((c for c in map(_name_class, context) if c in _CONTEXT_CLASSES), None)
  if outer == 'optimizer':
    return outer
  if outer == 'attention' and own not in ('copies/transposes', 'padding'):
    return outer
  if outer and own in ('GELU and other elementwise', 'other'):
    return outer
  return own


def hlo_kernel_class(name: str, instrs: Dict[str, Instruction],
                     comps: Dict[str, List[str]]) -> str:
  """The `KERNEL_CLASSES` entry of our top-level kernel `name` from the compiled HLO: its custom
  calls (cuBLAS, cuDNN attention), the ops inside it (a dot or convolution: GEMM; data movement
  alone: copies, or padding with a pad) and its `op_name` (model component and phase)."""
  inside = [instrs[n] for n in _called(name, instrs, comps)]
  opcodes = {i.opcode for i in inside} - {'fusion', 'call'}
  targets = [i.target for i in inside if i.target]
  phase, component = classify(instrs[name].op_name)
  if any(_ATTENTION_TARGETS.search(t) for t in targets):
    return 'attention'
  if opcodes <= _MOVES:
    return 'padding' if 'pad' in opcodes else 'copies/transposes'
  if component == 'attention core (QK, softmax, AV)':
    return 'attention'
  if opcodes & {'dot', 'convolution'} or any(_GEMM_TARGETS.search(t) for t in targets):
    return 'GEMM'
  if component == 'LayerNorm':
    return 'LayerNorm'
  op_name = instrs[name].op_name
  if 'softmax' in op_name:
    return 'softmax'
  if phase == 'optimizer, loss, other' and op_name and 'jvp(' not in op_name:
    return 'optimizer'  # outside the differentiated loss: clipping, Adam, the update
  return 'GELU and other elementwise'


def read_trace(trace_dir: str) -> List[dict]:
  files = sorted(glob.glob(os.path.join(trace_dir, 'plugins', 'profile', '*',
                                        'perfetto_trace.json.gz')))
  if not files:
    raise RuntimeError(f'jax.profiler wrote no Perfetto trace under {trace_dir}')
  with gzip.open(files[-1], 'rt') as f:
    data = json.load(f)
  return data['traceEvents'] if isinstance(data, dict) else data


def _threads(events: List[dict]) -> Dict[Tuple[int, int], Tuple[str, str]]:
  """(pid, tid) -> (process name, thread name) from the trace's metadata events."""
  processes = {e.get('pid'): e.get('args', {}).get('name', '') for e in events
               if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  return {(e.get('pid'), e.get('tid')): (processes.get(e.get('pid'), ''),
                                         e.get('args', {}).get('name', ''))
          for e in events if e.get('ph') == 'M' and e.get('name') == 'thread_name'}


def _instruction_names(instrs: Dict[str, Instruction]) -> Callable[[str], Optional[str]]:
  """A function from an event's or kernel's name to the HLO instruction it stands for
  ('%fusion.3 = ...', 'fusion.3', or XLA:GPU's kernel name 'fusion_3'), else None."""
  kernel_names = {n.replace('.', '_').replace('-', '_'): n for n in instrs}

  def lookup(text: str) -> Optional[str]:
    name = (text or '').lstrip('%').split(' ')[0]
    return name if name in instrs else kernel_names.get(name)

  return lookup


def kernel_events(events: List[dict], instrs: Dict[str, Instruction]
                  ) -> Tuple[List[Tuple[str, Optional[str], float]], str]:
  """([(kernel name, its HLO instruction or None, duration in us)], where they come from).

  A GPU's trace has a process per device ('/device:GPU:0') whose 'XLA Ops' line times each HLO
  instruction (all its kernels): used when present, unless it times CUDA graphs (XLA's command
  buffers, which hold many instructions each). Else its stream lines' kernels, joined to the HLO
  by the `hlo_op` the profiler records with them or by name (XLA names a fusion's kernel after
  it), others (cuBLAS, cuDNN) classified by name. On XLA:CPU every kernel event is named
  after its instruction; host events of other names are left out.
  """
  threads, instruction = _threads(events), _instruction_names(instrs)
  timed = [e for e in events if e.get('ph') == 'X']
  gpu = {key: thread for key, (process, thread) in threads.items()
         if process.startswith('/device:GPU')}
  if gpu:
    ops = {key for key, thread in gpu.items() if thread == 'XLA Ops'}
    if any('command_buffer' in e.get('name', '') for e in timed
           if (e.get('pid'), e.get('tid')) in ops):
      ops = set()
    if ops:
      out = [(e.get('name', ''), instruction(e.get('name', '')), e.get('dur', 0.))
             for e in timed if (e.get('pid'), e.get('tid')) in ops]
      return out, "the GPU's XLA Ops line"
    streams = {key for key, thread in gpu.items() if thread.startswith('Stream')}
    out = []
    for e in timed:
      if (e.get('pid'), e.get('tid')) in streams:
        name = e.get('name', '')
        hlo = instruction(e.get('args', {}).get('hlo_op', ''))
        out.append((name, hlo or instruction(name), e.get('dur', 0.)))
    return out, "the GPU's stream kernels"
  out = [(e['name'], e['name'], e.get('dur', 0.)) for e in timed if e.get('name') in instrs]
  return out, 'XLA:CPU kernels'


def summarize(events: List[dict], hlo_text: str, steps: int, top: int = 40) -> dict:
  """Kernel events joined to the HLO (`kernel_events`), grouped by (phase, component) and by
  kernel class; times per step. 'kernels': the `top` kernels by time, [name, class, ms/step]."""
  instrs, comps = parse_hlo(hlo_text), computations(hlo_text)
  ms, flops, kernels = (collections.defaultdict(float), collections.defaultdict(float),
                        collections.defaultdict(set))
  by_kernel = collections.defaultdict(float)
  found, source = kernel_events(events, instrs)
  cls_of = {}
  for kernel, hlo, dur in found:
    key = classify(instrs[hlo].op_name) if hlo else ('unmatched (by kernel name)', '-')
    if hlo:
      kernels[key].add(hlo)
      cls_of.setdefault(kernel, hlo_kernel_class(hlo, instrs, comps))
    else:
      cls_of.setdefault(kernel, kernel_class(kernel))
    ms[key] += dur / 1e3 / steps
    by_kernel[kernel] += dur / 1e3 / steps
  for key, names in kernels.items():
    flops[key] = sum(kernel_flops(n, instrs, comps) for n in names)
  total = sum(ms.values())
  rows = [{'phase': p, 'component': c, 'ms_per_step': t, 'share': t / total if total else 0.,
           'kernels': len(kernels[(p, c)]), 'gflop_per_step': flops[(p, c)] / 1e9,
           'gflop_per_s': flops[(p, c)] / 1e6 / t if t else 0.}
          for (p, c), t in sorted(ms.items(), key=lambda kv: -kv[1])]
  ranked = sorted(([k, cls_of[k], t] for k, t in by_kernel.items()), key=lambda r: -r[2])
  return {'kernel_ms_per_step': total, 'rows': rows, 'source': source, **by_class(ranked),
          'top': ranked[:top]}


def by_class(kernels: Iterable[Tuple[str, str, float]]) -> dict:
  """{'classes': {class: ms per step}} (every `KERNEL_CLASSES` entry) of (kernel, class, ms per
  step) triples; both sides of the comparison report this."""
  classes = dict.fromkeys(KERNEL_CLASSES, 0.)
  for _, cls, t in kernels:
    classes[cls] += t
  return {'classes': classes}


def profile_step(step: Callable[[], object], hlo_text: str, steps: int = 2) -> dict:
  """Runs `step` `steps` times under the JAX profiler; the per-component summary."""
  jax.block_until_ready(step())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        jax.block_until_ready(step())
    return summarize(read_trace(trace_dir), hlo_text, steps)


def class_table(columns: Sequence[Tuple[str, dict]]) -> List[dict]:
  """Rows of the kernel-class comparison: [{'class', name: ms per step, ...}] for each of
  `columns` ((name, profile with 'classes' and 'kernel_ms_per_step')), then the total."""
  rows = [{'class': cls, **{name: p['classes'].get(cls, 0.) for name, p in columns}}
          for cls in KERNEL_CLASSES]
  rows.append({'class': 'total kernel time',
               **{name: p['kernel_ms_per_step'] for name, p in columns}})
  return rows


def format_class_table(columns: Sequence[Tuple[str, dict]], title: str = '') -> str:
  """`class_table` as markdown, ms per step; with two or more columns, the first minus the last
  (ours against the reference) as the last column. Classes no column has are left out."""
  names = [name for name, _ in columns]
  diff = len(names) > 1
  head = ['kernel class', *[f'{n} ms' for n in names]] + ([f'{names[0]} - {names[-1]}'] if diff
                                                          else [])
  lines = ([title] if title else []) + ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for row in class_table(columns):
    values = [row[n] for n in names]
    if not any(values):
      continue
    cells = [row['class'], *[f'{v:.2f}' for v in values]]
    if diff:
      cells.append(f'{values[0] - values[-1]:+.2f}')
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


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
           'kernel_flops', 'KERNEL_CLASSES', 'NAME_CLASSES', 'kernel_class', 'hlo_kernel_class',
           'kernel_events', 'by_class', 'class_table', 'format_class_table']
