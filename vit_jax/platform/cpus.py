"""The processor: the cores this process may run on, and what /proc/cpuinfo says about it.

`usable()` counts the CPUs of this process's affinity mask (where the OS has one). `describe()`
reads /proc/cpuinfo (Linux): the model name, vendor, family / model / stepping numbers and the
vector extensions XLA:CPU and PyTorch choose kernels by (AVX2, AVX-512 and its BF16 / FP16 / VNNI
parts, AMX); elsewhere it falls back to `platform`. Every speed figure names the processor it was
measured on (`one_line`, `short`), and the compilation cache keys XLA:CPU's programs by it
(`fingerprint`).
"""

import hashlib
import os
import platform
from typing import Dict, List, Optional

CPUINFO = '/proc/cpuinfo'

# The /proc/cpuinfo flags that decide which kernels the compilers and libraries pick, in the order
# they are printed.
VECTOR_FLAGS = ('fma', 'avx', 'avx2', 'avx_vnni', 'avx512f', 'avx512bw', 'avx512vl',
                'avx512_vnni', 'avx512_bf16', 'avx512_fp16', 'amx_tile', 'amx_bf16', 'amx_int8')
# The fields that tell processors apart for XLA:CPU's code: the model (x86 'model name', Arm
# 'CPU part') and the instruction set extensions (x86 'flags', Arm 'Features').
IDENTITY_FIELDS = ('model name', 'flags', 'Features', 'CPU part')


def usable() -> int:
  """The CPUs this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def read_cpuinfo(path: str = CPUINFO) -> str:
  """The text of /proc/cpuinfo, or '' where there is none."""
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ''


def parse_blocks(text: str) -> List[Dict[str, str]]:
  """The `key: value` fields of each processor block of a /proc/cpuinfo text."""
  blocks, fields = [], {}
  for line in text.splitlines() + ['']:
    if not line.strip():
      if fields:
        blocks.append(fields)
        fields = {}
      continue
    key, sep, value = line.partition(':')
    if sep:
      fields.setdefault(key.strip(), value.strip())
  return blocks


def parse_cpuinfo(text: str) -> Dict[str, str]:
  """The first processor's `key: value` fields of a /proc/cpuinfo text."""
  blocks = parse_blocks(text)
  return blocks[0] if blocks else {}


def _int_or_none(value: Optional[str]) -> Optional[int]:
  try:
    return int(value)
  except (TypeError, ValueError):
    return None


def from_cpuinfo(text: str, cpus: Optional[int] = None) -> dict:
  """{model_name, vendor, family, model, stepping, cpus, vector_extensions} of a cpuinfo text."""
  fields = parse_cpuinfo(text)
  present = set(fields.get('flags', '').split())
  return {
      'model_name': fields.get('model name') or platform.processor() or platform.machine(),
      'vendor': fields.get('vendor_id', ''),
      'family': _int_or_none(fields.get('cpu family')),
      'model': _int_or_none(fields.get('model')),
      'stepping': _int_or_none(fields.get('stepping')),
      'cpus': cpus,
      'vector_extensions': [f for f in VECTOR_FLAGS if f in present],
  }


def describe(path: str = CPUINFO) -> dict:
  """This machine's processor (see `from_cpuinfo`); model_name from `platform` without cpuinfo."""
  return from_cpuinfo(read_cpuinfo(path), usable())


def fingerprint(path: str = CPUINFO) -> str:
  """'x86_64-1a2b3c4d': the machine type and a hash of every core's `IDENTITY_FIELDS`, the same
  for two machines whose processors run the same XLA:CPU code."""
  seen = {(k, v) for block in parse_blocks(read_cpuinfo(path)) for k, v in block.items()
          if k in IDENTITY_FIELDS}
  text = ''.join(f'{k}: {v}\n' for k, v in sorted(seen)) or platform.processor()
  digest = hashlib.sha256(text.encode()).hexdigest()[:8]
  return f'{platform.machine() or "unknown"}-{digest}'


def one_line(info: dict) -> str:
  """'NAME (family F model M, N CPUs; avx2 avx512f ...)' for tables and logs."""
  numbers: List[str] = []
  if info.get('family') is not None:
    numbers.append(f'family {info["family"]} model {info["model"]}')
  if info.get('cpus'):
    numbers.append(f'{info["cpus"]} CPUs')
  extensions = ' '.join(info.get('vector_extensions') or []) or 'no AVX'
  inside = ', '.join(numbers)
  return f'{info["model_name"]} ({inside}; {extensions})' if inside else (
      f'{info["model_name"]} ({extensions})')


def short(info: dict) -> str:
  """'NAME F/M' (model name, family/model): the processor column of a table."""
  if info.get('family') is None:
    return info['model_name']
  return f'{info["model_name"]} {info["family"]}/{info["model"]}'


__all__ = ['usable', 'read_cpuinfo', 'parse_blocks', 'parse_cpuinfo', 'from_cpuinfo', 'describe',
           'fingerprint', 'one_line', 'short', 'VECTOR_FLAGS', 'IDENTITY_FIELDS']
