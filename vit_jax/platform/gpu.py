"""NVIDIA GPUs: is one here, is the GPU build of JAX installed, and the XLA:GPU flags.

The GPU build of JAX is a PJRT plugin package (`jax-cuda13-plugin` or `jax-cuda12-plugin`, with
their `jax-cuda*-pjrt` and nvidia-* libraries); `make install ACCEL=cuda13` installs it from a
hash-pinned lock. A machine whose GPU JAX cannot see (the CPU-only build) gets `install_hint`.
`cudnn_available` says whether cuDNN can be used: not with the XLA:GPU compiler alone (`make
gpu-compiler`, vit_jax/platform/targets.py), which has no CUDA libraries.

`XLA_GPU_FLAGS`: the XLA:GPU options that matter for a transformer's train step, one named
variant each, for A/B runs (`bench --suite=gpu --suite_xla=NAME`). `DEFAULT_VARIANT` is the set a
GPU run applies; a variant joins it once a measurement on a GPU shows it helps.
"""

import importlib.util
import os
import shutil
import sys
from typing import Callable, Dict, Optional, Tuple

from vit_jax.errors import UserError

# Where the NVIDIA driver shows itself without any CUDA library: its kernel module's /proc entry
# and its command-line tool.
DRIVER_PROC = '/proc/driver/nvidia'
SMI = 'nvidia-smi'
# The PJRT plugin modules of JAX's CUDA builds (the packages jax-cuda13-plugin, jax-cuda12-plugin).
CUDA_PLUGINS = ('jax_cuda13_plugin', 'jax_cuda12_plugin')
INSTALL_COMMAND = 'make install ACCEL=cuda13'
# Where `make gpu-compiler` installs the XLA:GPU compiler (VIT_JAX_GPU_COMPILER: another folder):
# a CUDA plugin without the CUDA libraries, which compiles but never runs.
GPU_COMPILER_DIR = os.environ.get('VIT_JAX_GPU_COMPILER',
                                  os.path.join(sys.prefix, 'gpu-compiler'))

# name -> (XLA_FLAGS entries, purpose).
XLA_GPU_FLAGS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    'none': ((), "XLA's defaults"),
    'latency_hiding': (('--xla_gpu_enable_latency_hiding_scheduler=true',),
                       'schedules async work (collectives, copies) to overlap compute'),
    'no_triton_gemm': (('--xla_gpu_enable_triton_gemm=false',),
                       'every GEMM through cuBLAS instead of Triton-generated fusions'),
    'no_command_buffers': (('--xla_gpu_enable_command_buffer=',),
                           'no CUDA graphs: each kernel launched on its own'),
    'autotune_0': (('--xla_gpu_autotune_level=0',),
                   'no GEMM/conv autotuning: a faster compile, possibly slower kernels'),
}
# XLA's defaults: `no_triton_gemm` measured slower on the ViT-B/16 bf16 train step
# (benchmarks/RESULTS.md); the others wait for a measurement that shows a gain.
DEFAULT_VARIANT = 'none'


def nvidia_gpu_present(proc: str = DRIVER_PROC, which: Callable[[str], Optional[str]] = shutil.which
                       ) -> bool:
  """True if the NVIDIA driver is loaded here (its /proc entry or nvidia-smi exists)."""
  return os.path.exists(proc) or which(SMI) is not None


def cuda_jax_installed(find_spec: Callable = importlib.util.find_spec,
                       compiler_dir: str = GPU_COMPILER_DIR) -> bool:
  """True if a CUDA PJRT plugin of JAX is importable (without importing it or starting JAX),
  other than the compiler-only one in `compiler_dir` (on the import path once a compile for a
  GPU has loaded it)."""
  inside = os.path.join(os.path.realpath(compiler_dir), '')
  for name in CUDA_PLUGINS:
    spec = find_spec(name)
    origin = getattr(spec, 'origin', None) or ''
    if spec is not None and not os.path.realpath(origin).startswith(inside):
      return True
  return False


def install_hint(probe: Optional[Callable[[], bool]] = None,
                 cuda_installed: Optional[Callable[[], bool]] = None) -> Optional[str]:
  """The line for a machine with an NVIDIA GPU (`probe`, default `nvidia_gpu_present`) where JAX
  runs on the CPU because its CUDA build is missing (`cuda_installed`, default
  `cuda_jax_installed`), else None (with the CUDA build installed, the CPU was asked for)."""
  if not (probe or nvidia_gpu_present)() or (cuda_installed or cuda_jax_installed)():
    return None
  return (f'this machine has an NVIDIA GPU but JAX runs on the CPU: `{INSTALL_COMMAND}` (or '
          'ACCEL=cuda12 for a CUDA 12 driver) installs the GPU build')


def cudnn_available() -> bool:
  """Whether JAX finds cuDNN in this process, as its cuDNN attention asks before it lowers: false
  on the CPU build of JAX and with the XLA:GPU compiler alone (no CUDA libraries)."""
  try:
    from jax._src.lib import cuda_versions  # pylint: disable=g-import-not-at-top
  except ImportError:  # private API moved: take a CUDA build as complete
    return True
  if cuda_versions is None:
    return False
  try:
    cuda_versions.cudnn_get_version()
  except RuntimeError:  # "cuDNN not found": the library does not load
    return False
  return True


def variant_flags(name: str) -> Tuple[str, ...]:
  """The XLA_FLAGS entries of variant `name`; a UserError naming the valid ones otherwise."""
  if name not in XLA_GPU_FLAGS:
    raise UserError(f'unknown XLA:GPU flag variant {name!r}: use one of '
                     f'{", ".join(XLA_GPU_FLAGS)}')
  return XLA_GPU_FLAGS[name][0]


__all__ = ['XLA_GPU_FLAGS', 'DEFAULT_VARIANT', 'INSTALL_COMMAND', 'nvidia_gpu_present',
           'cuda_jax_installed', 'install_hint', 'cudnn_available', 'variant_flags']
