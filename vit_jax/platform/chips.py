"""The one table of accelerator chips, and the one line that names a run's devices.

Each row holds everything the code knows about one chip: the `device_kind` JAX reports for it,
its peak dense FLOP/s (for MFU), its memory per JAX device (for compile-only fit checks), and,
where `config.compile_for` can compile for it without the hardware (vit_jax/platform/targets.py),
the name it is asked for by and the shape of its slices (TPUs) or its streaming-multiprocessor
count (GPUs).

Model FLOPs utilisation (MFU) divides the model's analytic FLOP rate (`vit_jax.models.cost`) by the
peak of the chips it runs on: a chip of `CHIPS`, matched from the `device_kind` JAX reports, or on
a CPU (or an unknown chip) the matmul rate measured on it (`measure_matmul_flops`).

Figures are per JAX device (a TPU v2/v3 core, every other chip whole), dense (no structured
sparsity), from the vendors' datasheets:
  NVIDIA H100 Tensor Core GPU datasheet (SXM5 and PCIe columns), NVIDIA H200 Tensor Core GPU
  datasheet (SXM and NVL), NVIDIA A100 Tensor Core GPU datasheet (SXM4/PCIe, 40 and 80 GB),
  NVIDIA L4 Tensor Core GPU datasheet; Google Cloud TPU system architecture pages (v2, v3, v4,
  v5e, v5p, v6e: "peak compute per chip", "HBM capacity / bandwidth per chip").
NVIDIA quotes tensor throughput with sparsity; the dense figure is half of it.
`fp8_flops`: the dense fp8 (e4m3/e5m2) tensor rate, None where the chip has no fp8 matmul units;
NVIDIA GPUs multiply in fp8 from compute capability 8.9 (Ada Lovelace, Hopper) on
(`FP8_MIN_COMPUTE_CAPABILITY`), which decides `fp8_support` for a GPU missing from the table.
`fp32`: the rate an fp32 matmul runs at with JAX's default precision. On NVIDIA GPUs since Ampere
that is TF32 on the tensor cores (XLA:GPU's default for fp32 dots), so the TF32 dense figure; on
TPUs the default precision multiplies fp32 operands in one bf16 pass, so the bf16 figure.
Memory: the total CUDA's device query reports for the H100 SXM and the H200 (what a compile for
them is checked against), the datasheet capacity for the others.
"""

import dataclasses
import re
import time
from typing import Callable, Iterable, Optional, Sequence, Tuple

from vit_jax.platform import gpu

TERA = 1e12
GB = 1e9
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class TpuSlices:
  """How Cloud TPU sells slices of one TPU generation (`v3-8`, `v4-32`, `v5litepod-16`)."""
  counts: str            # what the number in 'v3-8' counts: 'cores' (2 per chip) or 'chips'
  dims: int              # torus dimensions of a topology name ('v3:4x4' 2, 'v4:2x2x2' 3)
  devices_per_chip: int  # JAX devices per chip (v2/v3: one per core; megacore chips: one)
  min_chips: int         # the smallest slice
  # The TPU compiler's chip configuration for a deviceless topology: 'megacore' presents each
  # two-core chip as one device, as the TPU runtime does on v4 and v5p hosts.
  chip_config: str = 'default'


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str              # as the docs and tables name it
  kind: str              # the device_kind JAX reports for it
  pattern: str           # every device_kind it reports as (regex, full match)
  bf16_flops: float      # dense peak, FLOP/s per JAX device
  fp32_flops: float      # dense peak of an fp32 matmul at JAX's default precision (see above)
  hbm_bytes: float       # memory per JAX device
  hbm_bytes_per_s: float
  target: Optional[str] = None         # its name in config.compile_for ('v3' of 'v3-8', 'h100')
  slices: Optional[TpuSlices] = None   # TPUs: how its slices are sold and shaped
  sm_count: Optional[int] = None       # GPUs compiled for without one: streaming multiprocessors
  fp8_flops: Optional[float] = None    # dense fp8 peak, FLOP/s per JAX device (None: no fp8)

  @property
  def platform(self) -> str:
    return 'tpu' if self.kind.startswith('TPU') else 'gpu'


# The first match wins, so specific names first.
CHIPS: Tuple[Chip, ...] = (
    Chip('H200 NVL', 'NVIDIA H200 NVL', r'NVIDIA H200 NVL', 835.5 * TERA, 417.5 * TERA,
         141 * GIB, 4.8e12, fp8_flops=1670.5 * TERA),
    Chip('H200', 'NVIDIA H200', r'NVIDIA H200.*', 989.5 * TERA, 494.5 * TERA, 150_754_820_096,
         4.8e12, target='h200', sm_count=132, fp8_flops=1979 * TERA),
    Chip('H100 PCIe', 'NVIDIA H100 PCIe', r'NVIDIA H100 PCIe', 756 * TERA, 378 * TERA, 80 * GIB,
         2.0e12, fp8_flops=1513 * TERA),
    Chip('H100 NVL', 'NVIDIA H100 NVL', r'NVIDIA H100 NVL', 835.5 * TERA, 417.5 * TERA,
         94 * GIB, 3.9e12, fp8_flops=1670.5 * TERA),
    Chip('H100 SXM', 'NVIDIA H100 80GB HBM3', r'NVIDIA H100.*', 989.5 * TERA, 494.5 * TERA,
         84_978_434_048, 3.35232e12, target='h100', sm_count=132, fp8_flops=1979 * TERA),
    Chip('A100 80GB', 'NVIDIA A100-SXM4-80GB', r'NVIDIA A100.*80GB.*', 312 * TERA, 156 * TERA,
         80 * GIB, 2.039e12),
    Chip('A100 40GB', 'NVIDIA A100-SXM4-40GB', r'NVIDIA A100.*', 312 * TERA, 156 * TERA,
         40 * GIB, 1.555e12),
    Chip('L4', 'NVIDIA L4', r'NVIDIA L4', 121 * TERA, 60 * TERA, 24 * GIB, 300 * GB,
         fp8_flops=242.5 * TERA),
    Chip('TPU v2 (per core)', 'TPU v2', r'TPU v2', 22.5 * TERA, 22.5 * TERA, 8 * GIB, 300 * GB,
         target='v2', slices=TpuSlices('cores', 2, 2, 4)),
    Chip('TPU v3 (per core)', 'TPU v3', r'TPU v3', 61.5 * TERA, 61.5 * TERA, 16 * GIB, 450 * GB,
         target='v3', slices=TpuSlices('cores', 2, 2, 4)),
    Chip('TPU v4', 'TPU v4', r'TPU v4', 275 * TERA, 275 * TERA, 32 * GIB, 1228 * GB,
         target='v4', slices=TpuSlices('cores', 3, 1, 4, 'megacore')),
    Chip('TPU v5e', 'TPU v5 lite', r'TPU v5 ?lite|TPU v5e', 197 * TERA, 197 * TERA, 16 * GIB,
         819 * GB, target='v5e', slices=TpuSlices('chips', 2, 1, 1)),
    Chip('TPU v5p', 'TPU v5', r'TPU v5p?', 459 * TERA, 459 * TERA, 95 * GIB, 2765 * GB,
         target='v5p', slices=TpuSlices('cores', 3, 1, 4, 'megacore')),
    Chip('TPU v6e', 'TPU v6 lite', r'TPU v6 ?lite|TPU v6e', 918 * TERA, 918 * TERA, 32 * GIB,
         1640 * GB, target='v6e', slices=TpuSlices('chips', 2, 1, 1)),
)

# NVIDIA GPUs with fp8 tensor cores: compute capability 8.9 (Ada Lovelace) and later (Hopper 9.0).
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)

MATMUL_SIZE = 2048  # the side of the square matmul timed for a chip's measured peak


def find_chip(device_kind: str) -> Optional[Chip]:
  """The `CHIPS` entry of a JAX `device_kind` ('NVIDIA H200', 'TPU v5 lite'), else None."""
  for chip in CHIPS:
    if re.fullmatch(chip.pattern, device_kind.strip()):
      return chip
  return None


def _compute_capability(device) -> Optional[Tuple[int, int]]:
  """(major, minor) of a CUDA device ('9.0'), None where JAX reports none."""
  value = getattr(device, 'compute_capability', None)
  if not value:
    return None
  major, _, minor = str(value).partition('.')
  return int(major), int(minor or 0)


def fp8_support(device) -> Optional[str]:
  """None if `device` multiplies in fp8, else why not (one phrase). A GPU reporting its compute
  capability is judged by it, any other device by the chip table (`fp8_flops`)."""
  kind = getattr(device, 'device_kind', '') or device.platform
  capability = _compute_capability(device) if device.platform in ('gpu', 'cuda') else None
  if capability is not None:
    if capability >= FP8_MIN_COMPUTE_CAPABILITY:
      return None
    return (f'{kind} has compute capability {capability[0]}.{capability[1]}, below the '
            f'{FP8_MIN_COMPUTE_CAPABILITY[0]}.{FP8_MIN_COMPUTE_CAPABILITY[1]} of fp8 tensor cores')
  chip = find_chip(kind)
  if chip is not None and chip.fp8_flops:
    return None
  return f'{kind} has no fp8 matmul units that JAX uses'


def compile_targets(platform: str) -> Tuple[Chip, ...]:
  """The chips of `platform` ('tpu' or 'gpu') that `config.compile_for` compiles for."""
  return tuple(c for c in CHIPS if c.target and c.platform == platform)


def datasheet_peak(device_kind: str, dtype: str) -> Optional[float]:
  """Dense peak FLOP/s of one device of `device_kind` for `dtype` matmuls (bfloat16/float16 or
  float32), or None for a chip not in the table (a CPU)."""
  chip = find_chip(device_kind)
  if chip is None:
    return None
  return chip.fp32_flops if str(dtype) in ('float32', 'fp32') else chip.bf16_flops


def hbm_bytes(devices: Sequence) -> Optional[int]:
  """Memory per device of `devices` when they are a known chip, else None (a CPU)."""
  chip = find_chip(getattr(devices[0], 'device_kind', '') or '')
  return None if chip is None else int(chip.hbm_bytes)


def measure_matmul_flops(dtype: str = 'float32', size: int = MATMUL_SIZE,
                         repeats: int = 10) -> float:
  """FLOP/s of a size^3 matmul on the default device: the fastest of `repeats` calls after two
  warm-ups (a peak, the machine's matmul rate)."""
  import jax  # pylint: disable=g-import-not-at-top  # the table is read without starting JAX
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (size, size), dtype)
  f = jax.jit(lambda x, y: x @ y)
  for _ in range(2):
    jax.block_until_ready(f(a, b))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(f(a, b))
    best = min(best, time.perf_counter() - start)
  return 2.0 * size ** 3 / best


def peak_flops(devices: Sequence, dtype: str,
               measure: Callable[[str], float] = measure_matmul_flops) -> Tuple[float, str]:
  """(peak FLOP/s of all `devices` together, where it comes from): the datasheet figure of a known
  chip times the device count, else `measure(dtype)` (the matmul rate of the default device,
  which on a CPU is all its cores) once per process."""
  kind = getattr(devices[0], 'device_kind', '')
  per_device = datasheet_peak(kind, dtype)
  if per_device is not None:
    return per_device * len(devices), f'{find_chip(kind).name} datasheet, {dtype}'
  return measure(dtype), f'measured {MATMUL_SIZE}^3 {dtype} matmul'


def describe_devices(devices: Iterable, gpu_probe: Optional[Callable[[], bool]] = None,
                     cuda_installed: Optional[Callable[[], bool]] = None) -> str:
  """'8 x cpu', '1 x NVIDIA H200', '8 x TPU v3': the count and kind of `devices` (several kinds
  joined by ' + '), for log lines and reports. On CPU devices of a machine that has an NVIDIA GPU
  but not the CUDA build of JAX (`gpu.install_hint`, which the probes are passed to), the line
  adds how to install it."""
  devices = list(devices)
  counts = {}
  for d in devices:
    kind = getattr(d, 'device_kind', None) or d.platform
    counts[kind] = counts.get(kind, 0) + 1
  line = ' + '.join(f'{n} x {kind}' for kind, n in counts.items())
  if devices and all(d.platform == 'cpu' for d in devices):
    hint = gpu.install_hint(gpu_probe, cuda_installed)
    if hint:
      line += f' ({hint})'
  return line


__all__ = ['Chip', 'CHIPS', 'TpuSlices', 'FP8_MIN_COMPUTE_CAPABILITY', 'find_chip',
           'fp8_support', 'compile_targets', 'datasheet_peak', 'hbm_bytes',
           'measure_matmul_flops', 'peak_flops', 'describe_devices', 'MATMUL_SIZE']
