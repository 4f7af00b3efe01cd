"""NVIDIA GPUs: is one here, is the GPU build of JAX installed, and the XLA:GPU flags.

The GPU build of JAX is a PJRT plugin package (`jax-cuda13-plugin` or `jax-cuda12-plugin`, with
their `jax-cuda*-pjrt` and nvidia-* libraries); `make install ACCEL=cuda13` installs it from a
hash-pinned lock. A machine whose GPU JAX cannot see (the CPU-only build) gets `install_hint`.

`compile_only_devices('h100')`: XLA's GPU compiler runs without a GPU (deviceless compilation):
the CUDA PJRT plugin (`make gpu-compiler`, .venv/gpu-compiler) describes a GPU from a
`GpuTargetConfigProto` (`GPU_TARGETS`) and JAX compiles for it, so the memory analysis of a step
compiled for an H100 comes from any machine. Without a GPU there is no autotuning, so those
compiles run with `DEVICELESS_FLAGS` (cuBLAS for every GEMM, no autotuning): what the compiler
picks on the GPU itself can differ, its memory too. cuDNN's fused attention needs the cuDNN
library to compile: `model.attention=cudnn` compiles only with the nvidia-cudnn-cu13 wheel of
requirements-cuda13.lock unpacked into the same folder.

`XLA_GPU_FLAGS`: the XLA:GPU options that matter for a transformer's train step, one named
variant each, for A/B runs (`bench --suite=gpu --suite_xla=NAME`). `DEFAULT_VARIANT` is the set a
GPU run applies; a variant joins it once a measurement on a GPU shows it helps.
"""

import importlib.util
import os
import shutil
import sys
from typing import Callable, Dict, MutableMapping, Optional, Tuple

from vit_jax.errors import UserError

# Where the NVIDIA driver shows itself without any CUDA library: its kernel module's /proc entry
# and its command-line tool.
DRIVER_PROC = '/proc/driver/nvidia'
SMI = 'nvidia-smi'
# The PJRT plugin modules of JAX's CUDA builds (the packages jax-cuda13-plugin, jax-cuda12-plugin).
CUDA_PLUGINS = ('jax_cuda13_plugin', 'jax_cuda12_plugin')
INSTALL_COMMAND = 'make install ACCEL=cuda13'

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


# GPU descriptions for deviceless compiles (GpuTargetConfigProto text): the device properties
# CUDA reports for an H100 SXM (132 SMs, 80 GB; NVIDIA H100 datasheet, CUDA device query) and an
# H200 (the same chip with 141 GB of HBM3e at 4.8 TB/s; NVIDIA H200 datasheet).
_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }} registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
device_description_str: "{name}"
"""
GPU_TARGETS: Dict[str, str] = {
    'h100': _HOPPER.format(bandwidth=3352320000000, memory=84978434048,
                           name='NVIDIA H100 80GB HBM3'),
    'h200': _HOPPER.format(bandwidth=4800000000000, memory=150754820096, name='NVIDIA H200'),
}
# Deviceless compiles cannot autotune: Triton's GEMM fusions need it to pick their tiles.
DEVICELESS_FLAGS = ('--xla_gpu_enable_triton_gemm=false', '--xla_gpu_autotune_level=0')
# Where `make gpu-compiler` installs the compiler (VIT_JAX_GPU_COMPILER: another folder).
COMPILER_DIR = os.environ.get('VIT_JAX_GPU_COMPILER', os.path.join(sys.prefix, 'gpu-compiler'))
COMPILER_HINT = 'run `make gpu-compiler` once (it installs it into .venv/gpu-compiler)'


def prepare_deviceless(environ: MutableMapping[str, str], compiler_dir: str = COMPILER_DIR
                       ) -> None:
  """Before JAX starts: puts the GPU compiler on the import path and `DEVICELESS_FLAGS` into
  XLA_FLAGS, and lets the plugin load without the CUDA libraries. A one-line UserError when the
  compiler is not installed."""
  if not os.path.isdir(os.path.join(compiler_dir, 'jax_plugins')):
    raise UserError(f'compiling for an NVIDIA GPU without one needs the XLA:GPU compiler, which '
                    f'is not installed in {compiler_dir}: {COMPILER_HINT}')
  if compiler_dir not in sys.path:
    sys.path.insert(0, compiler_dir)
  environ['JAX_SKIP_CUDA_CONSTRAINTS_CHECK'] = '1'  # no CUDA libraries: nothing to check
  kept = [f for f in environ.get('XLA_FLAGS', '').split()
          if f.split('=')[0] not in {d.split('=')[0] for d in DEVICELESS_FLAGS}]
  environ['XLA_FLAGS'] = ' '.join([*kept, *DEVICELESS_FLAGS])


def compile_only_devices(name: str) -> list:
  """One compile-only device of GPU `name` (a key of `GPU_TARGETS`), after `prepare_deviceless`."""
  if name not in GPU_TARGETS:
    raise UserError(f'unknown GPU {name!r} to compile for: use one of {", ".join(GPU_TARGETS)}')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  topology = topologies.get_topology_desc(platform='cuda', topology='1x1x1',
                                          target_config=GPU_TARGETS[name])
  return list(topology.devices)


def cudnn_compiles() -> bool:
  """Whether cuDNN's fused attention can be traced here, after `prepare_deviceless`: JAX asks
  the cuDNN library for its version, which the compiler-only install does not have."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  q = jax.ShapeDtypeStruct((1, 8, 1, 8), jnp.bfloat16)
  try:
    jax.eval_shape(lambda q: jax.nn.dot_product_attention(q, q, q, implementation='cudnn'), q)
  except RuntimeError:  # "cuDNN not found."
    return False
  return True


def nvidia_gpu_present(proc: str = DRIVER_PROC, which: Callable[[str], Optional[str]] = shutil.which
                       ) -> bool:
  """True if the NVIDIA driver is loaded here (its /proc entry or nvidia-smi exists)."""
  return os.path.exists(proc) or which(SMI) is not None


def cuda_jax_installed(find_spec: Callable = importlib.util.find_spec) -> bool:
  """True if a CUDA PJRT plugin of JAX is importable (without importing it or starting JAX)."""
  return any(find_spec(name) is not None for name in CUDA_PLUGINS)


def install_hint(probe: Optional[Callable[[], bool]] = None,
                 cuda_installed: Optional[Callable[[], bool]] = None) -> Optional[str]:
  """The line for a machine with an NVIDIA GPU (`probe`, default `nvidia_gpu_present`) where JAX
  runs on the CPU because its CUDA build is missing (`cuda_installed`, default
  `cuda_jax_installed`), else None (with the CUDA build installed, the CPU was asked for)."""
  if not (probe or nvidia_gpu_present)() or (cuda_installed or cuda_jax_installed)():
    return None
  return (f'this machine has an NVIDIA GPU but JAX runs on the CPU: `{INSTALL_COMMAND}` (or '
          'ACCEL=cuda12 for a CUDA 12 driver) installs the GPU build')


def variant_flags(name: str) -> Tuple[str, ...]:
  """The XLA_FLAGS entries of variant `name`; a UserError naming the valid ones otherwise."""
  if name not in XLA_GPU_FLAGS:
    raise UserError(f'unknown XLA:GPU flag variant {name!r}: use one of '
                     f'{", ".join(XLA_GPU_FLAGS)}')
  return XLA_GPU_FLAGS[name][0]


def apply_flags(environ: MutableMapping[str, str], name: str = DEFAULT_VARIANT) -> None:
  """Appends variant `name`'s flags to environ['XLA_FLAGS'] (before JAX starts), replacing any
  earlier value of the same flag; only where a CUDA build of JAX is installed."""
  flags = variant_flags(name)
  if not flags or not cuda_jax_installed():
    return
  names = {f.split('=')[0] for f in flags}
  kept = [f for f in environ.get('XLA_FLAGS', '').split() if f.split('=')[0] not in names]
  environ['XLA_FLAGS'] = ' '.join([*kept, *flags])


__all__ = ['GPU_TARGETS', 'DEVICELESS_FLAGS', 'prepare_deviceless', 'compile_only_devices',
           'XLA_GPU_FLAGS', 'DEFAULT_VARIANT', 'INSTALL_COMMAND', 'nvidia_gpu_present',
           'cuda_jax_installed', 'install_hint', 'variant_flags', 'apply_flags']
