"""Which processor a benchmark ran on: every speed figure names it (they differ by processor).

`describe()` reads /proc/cpuinfo (Linux): the model name, vendor, family / model / stepping numbers,
the CPUs this process may run on, and the vector extensions XLA:CPU and PyTorch choose kernels by
(AVX2, AVX-512 and its BF16 / FP16 / VNNI parts, AMX). Elsewhere it falls back to `platform`.
"""

import platform
from typing import Dict, List, Optional

from vit_jax.platform import cpus as cpus_lib

CPUINFO = '/proc/cpuinfo'

# The /proc/cpuinfo flags that decide which kernels the compilers and libraries pick, in the order
# they are printed.
VECTOR_FLAGS = ('fma', 'avx', 'avx2', 'avx_vnni', 'avx512f', 'avx512bw', 'avx512vl',
                'avx512_vnni', 'avx512_bf16', 'avx512_fp16', 'amx_tile', 'amx_bf16', 'amx_int8')


def parse_cpuinfo(text: str) -> Dict[str, str]:
  """The first processor's `key: value` fields of a /proc/cpuinfo text."""
  fields = {}
  for line in text.splitlines():
    if not line.strip():
      if fields:
        break  # the end of the first processor's block
      continue
    key, sep, value = line.partition(':')
    if sep:
      fields.setdefault(key.strip(), value.strip())
  return fields


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
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    text = ''
  return from_cpuinfo(text, cpus_lib.usable())


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


__all__ = ['describe', 'from_cpuinfo', 'parse_cpuinfo', 'one_line', 'short', 'VECTOR_FLAGS']
