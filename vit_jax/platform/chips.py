"""The one table of known accelerator chips (peak dense FLOP/s, memory) and the device line.

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
"""

import dataclasses
import re
import time
from typing import Callable, Iterable, Optional, Sequence, Tuple

TERA = 1e12
GB = 1e9
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str            # as the docs and tables name it
  bf16_flops: float    # dense peak, FLOP/s per JAX device
  fp32_flops: float    # dense peak of an fp32 matmul at JAX's default precision (see above)
  hbm_bytes: float     # memory per JAX device
  hbm_bytes_per_s: float
  fp8_flops: Optional[float] = None  # dense fp8 peak, FLOP/s per JAX device (None: no fp8)


# (device_kind pattern (regex, full match), chip); the first match wins, so specific names first.
CHIPS: Tuple[Tuple[str, Chip], ...] = (
    (r'NVIDIA H200 NVL', Chip('H200 NVL', 835.5 * TERA, 417.5 * TERA, 141 * GB, 4.8e12,
                              1670.5 * TERA)),
    (r'NVIDIA H200.*', Chip('H200', 989.5 * TERA, 494.5 * TERA, 141 * GB, 4.8e12, 1979 * TERA)),
    (r'NVIDIA H100 PCIe', Chip('H100 PCIe', 756 * TERA, 378 * TERA, 80 * GB, 2.0e12,
                               1513 * TERA)),
    (r'NVIDIA H100 NVL', Chip('H100 NVL', 835.5 * TERA, 417.5 * TERA, 94 * GB, 3.9e12,
                              1670.5 * TERA)),
    (r'NVIDIA H100.*', Chip('H100 SXM', 989.5 * TERA, 494.5 * TERA, 80 * GB, 3.35e12,
                            1979 * TERA)),
    (r'NVIDIA A100.*80GB.*', Chip('A100 80GB', 312 * TERA, 156 * TERA, 80 * GB, 2.039e12)),
    (r'NVIDIA A100.*', Chip('A100 40GB', 312 * TERA, 156 * TERA, 40 * GB, 1.555e12)),
    (r'NVIDIA L4', Chip('L4', 121 * TERA, 60 * TERA, 24 * GB, 300 * GB, 242.5 * TERA)),
    (r'TPU v2', Chip('TPU v2 (per core)', 22.5 * TERA, 22.5 * TERA, 8 * GIB, 300 * GB)),
    (r'TPU v3', Chip('TPU v3 (per core)', 61.5 * TERA, 61.5 * TERA, 16 * GIB, 450 * GB)),
    (r'TPU v4', Chip('TPU v4', 275 * TERA, 275 * TERA, 32 * GIB, 1228 * GB)),
    (r'TPU v5 ?lite|TPU v5e', Chip('TPU v5e', 197 * TERA, 197 * TERA, 16 * GIB, 819 * GB)),
    (r'TPU v5p?', Chip('TPU v5p', 459 * TERA, 459 * TERA, 95 * GIB, 2765 * GB)),
    (r'TPU v6 ?lite|TPU v6e', Chip('TPU v6e', 918 * TERA, 918 * TERA, 32 * GIB, 1640 * GB)),
)

# NVIDIA GPUs with fp8 tensor cores: compute capability 8.9 (Ada Lovelace) and later (Hopper 9.0).
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)

MATMUL_SIZE = 2048  # the measured matmul: the fastest of the sizes 1024-4096 on the CPUs here


def find_chip(device_kind: str) -> Optional[Chip]:
  """The `CHIPS` entry of a JAX `device_kind` ('NVIDIA H200', 'TPU v5 lite'), else None."""
  for pattern, chip in CHIPS:
    if re.fullmatch(pattern, device_kind.strip()):
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


def datasheet_peak(device_kind: str, dtype: str) -> Optional[float]:
  """Dense peak FLOP/s of one device of `device_kind` for `dtype` matmuls (bfloat16/float16 or
  float32), or None for a chip not in the table (a CPU)."""
  chip = find_chip(device_kind)
  if chip is None:
    return None
  return chip.fp32_flops if str(dtype) in ('float32', 'fp32') else chip.bf16_flops


def measure_matmul_flops(dtype: str = 'float32', size: int = MATMUL_SIZE,
                         repeats: int = 10) -> float:
  """FLOP/s of a size^3 matmul on the default device: the fastest of `repeats` calls after two
  warm-ups (a peak, the machine's matmul rate)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
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
  """'8 x cpu', '1 x NVIDIA H200': the count and kind of `devices` (several kinds joined by
  ' + '). On CPU devices of a machine that has an NVIDIA GPU but not the CUDA build of JAX
  (`gpu.install_hint`, which the probes are passed to), the line adds how to install it."""
  from vit_jax.platform import gpu  # pylint: disable=g-import-not-at-top
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


__all__ = ['Chip', 'CHIPS', 'FP8_MIN_COMPUTE_CAPABILITY', 'find_chip', 'fp8_support',
           'datasheet_peak', 'measure_matmul_flops', 'peak_flops',
           'describe_devices', 'MATMUL_SIZE']
