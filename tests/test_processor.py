"""The processor (vit_jax/platform/cpus.py): parsed from /proc/cpuinfo texts of the processors
seen so far."""

import os

from vit_jax.platform import cpus

# The first processor block of /proc/cpuinfo on two of this project's machines (flags shortened
# to the ones that matter plus a few others).
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 fma avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 99
model name\t: not the first block
"""
XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fma avx avx2 avx_vnni avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_tile
"""


def test_parses_the_first_processor_block():
  info = cpus.from_cpuinfo(EPYC, cpus=2)
  assert info == {'model_name': 'AMD EPYC', 'vendor': 'AuthenticAMD', 'family': 25, 'model': 17,
                  'stepping': 1, 'cpus': 2,
                  'vector_extensions': ['fma', 'avx', 'avx2', 'avx512f', 'avx512bw', 'avx512vl',
                                        'avx512_vnni', 'avx512_bf16']}
  assert cpus.one_line(info) == (
      'AMD EPYC (family 25 model 17, 2 CPUs; fma avx avx2 avx512f avx512bw avx512vl avx512_vnni '
      'avx512_bf16)')
  assert cpus.short(info) == 'AMD EPYC 25/17'


def test_intel_fp16_and_amx_are_named():
  info = cpus.from_cpuinfo(XEON, cpus=2)
  assert (info['family'], info['model'], info['stepping']) == (6, 207, 2)
  assert 'avx512_fp16' in info['vector_extensions'] and 'amx_tile' in info['vector_extensions']
  assert 'avx512_fp16' not in cpus.from_cpuinfo(EPYC)['vector_extensions']
  assert cpus.short(info) == 'Intel(R) Xeon(R) Processor 6/207'


def test_without_cpuinfo_the_model_name_still_comes_from_platform(tmp_path):
  info = cpus.describe(str(tmp_path / 'absent'))
  assert info['model_name'] and info['family'] is None and info['vector_extensions'] == []
  assert info['cpus'] >= 1
  assert cpus.short(info) == info['model_name']
  assert cpus.one_line(info).endswith('CPUs; no AVX)')


def test_this_machine_matches_its_cpuinfo():
  info = cpus.describe()
  assert info['model_name'] and info['cpus'] >= 1
  if os.path.exists(cpus.CPUINFO):  # Linux: the same fields as the file's first block
    with open(cpus.CPUINFO) as f:
      fields = cpus.parse_cpuinfo(f.read())
    assert info['model_name'] == fields['model name']
    assert info['family'] == int(fields['cpu family']) and info['model'] == int(fields['model'])
