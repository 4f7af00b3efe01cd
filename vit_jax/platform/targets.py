"""Compiling for devices that are not here: a Cloud TPU slice or an NVIDIA GPU (`compile_for`).

`parse(name)` reads a target the way `config.compile_for` (and `bench --compile_for`) names it:

  v3-8, v4-32, v5litepod-16, v5p-128, v6e-8   a Cloud TPU slice, as `gcloud` names it
  v3:4x4, v4:2x2x2, v5e:2x4                    a TPU topology, as the TPU runtime names it
  h100, h200                                   one NVIDIA GPU

The chips, their memory and their slice shapes come from the one chip table
(vit_jax/platform/chips.py). `devices(target)` hands out the target's devices without the
hardware, from the compiler that describes it; `jax.jit(...).lower(...).compile()` on a mesh of
them runs that compiler ahead of time, so the memory figures are the target's own. Compile with
`compiler_options(target)`.

TPU: the TPU compiler (libtpu) describes the topology. Where libtpu comes from, first match wins:
`TPU_LIBRARY_PATH`; an importable `libtpu` package (a Cloud TPU VM with `jax[tpu]`);
`<venv>/tpu-compiler/libtpu/libtpu.so`, which `make tpu-compiler` installs from
`requirements-tpu.lock`. It is kept out of the venv's import path on purpose: with libtpu
importable, every JAX process looks for TPU chips at start-up and logs errors when none are there.

GPU: XLA's GPU compiler runs without a GPU (deviceless compilation). The CUDA PJRT plugin
(`make gpu-compiler`, .venv/gpu-compiler, outside the import path for the same reason) describes
the GPU from a `GpuTargetConfigProto` (`gpu_target_config`) and JAX compiles for it; it is loaded
on first use (`load_gpu_compiler`). Without a GPU there is no autotuning: those compiles run with
`DEVICELESS_OPTIONS` (cuBLAS for every GEMM, no autotuning), so what the compiler picks on the
GPU itself can differ, its memory too. The plugin alone has no cuDNN: there
`model.attention=auto` compiles the einsum kernel (vit_jax/models/attention.py).
"""

import dataclasses
import importlib
import math
import os
import re
import sys
from typing import Dict, List, Optional

from vit_jax import quiet
from vit_jax.errors import UserError
from vit_jax.platform import chips
from vit_jax.platform import gpu

GIB = 2 ** 30
LIBTPU_VERSION = '0.0.42.1'  # requirements-tpu.lock; the libtpu that jax 0.10.2's `tpu` extra names
INSTALL_HINT = ("run `make tpu-compiler` (installs requirements-tpu.lock into .venv/tpu-compiler), "
                f"or `pip install libtpu=={LIBTPU_VERSION}` and set TPU_LIBRARY_PATH to its libtpu.so")
ALIASES = {'v5litepod': 'v5e'}  # the names gcloud sells a TPU generation under
TPU_EXAMPLES = ('v3-8, v3-32 ... v3-2048, v4-8, v5litepod-16, v5p-128, v6e-8, or a topology like '
                'v3:4x4')

GPU_COMPILER_HINT = 'run `make gpu-compiler` once (it installs it into .venv/gpu-compiler)'
# Deviceless GPU compiles cannot autotune: Triton's GEMM fusions need it to pick their tiles.
DEVICELESS_OPTIONS = {'xla_gpu_enable_triton_gemm': False, 'xla_gpu_autotune_level': 0}


@dataclasses.dataclass(frozen=True)
class Target:
  """Devices to compile for: a TPU slice or one GPU."""
  name: str            # as the user wrote it
  chip: chips.Chip
  topology: str        # what the compiler takes: 'v3:8x16' (TPU), '1x1x1' (one GPU)
  num_devices: int     # JAX devices (cores on v2/v3, chips otherwise)

  @property
  def platform(self) -> str:
    return self.chip.platform

  @property
  def hbm_bytes(self) -> int:
    return int(self.chip.hbm_bytes)

  @property
  def accelerator_type(self) -> str:
    """A TPU slice as `gcloud --accelerator-type` names it ('v3-8', 'v5litepod-16')."""
    shape = self.chip.slices
    chip_count = self.num_devices // shape.devices_per_chip
    count = chip_count * 2 if shape.counts == 'cores' else chip_count
    sold_as = next((a for a, g in ALIASES.items() if g == self.chip.target), self.chip.target)
    return f'{sold_as}-{count}'

  def describe(self) -> str:
    if self.platform == 'gpu':
      return (f'{self.name} ({self.chip.kind}, {self.hbm_bytes / GIB:.4g} GiB; compiled without '
              f'the GPU: no autotuning, cuBLAS GEMMs)')
    unit = 'core' if self.chip.slices.devices_per_chip > 1 else 'chip'
    return (f'{self.name} ({self.chip.kind}, topology {self.topology}, {self.num_devices} '
            f'{unit}s, {self.hbm_bytes / GIB:g} GiB HBM per {unit})')


def _tpu_generations() -> Dict[str, chips.Chip]:
  return {c.target: c for c in chips.compile_targets('tpu')}


def _gpus() -> Dict[str, chips.Chip]:
  return {c.target: c for c in chips.compile_targets('gpu')}


GPUS = tuple(sorted(c.target for c in chips.compile_targets('gpu')))  # 'h100', 'h200'


def _unknown(name: str) -> UserError:
  return UserError(f'unknown compile target {name!r} in config.compile_for: use a TPU slice '
                   f'({TPU_EXAMPLES}) or an NVIDIA GPU ({", ".join(GPUS)})')


def _torus(chip_count: int, dims: int) -> List[int]:
  """The torus Cloud TPU builds for `chip_count` chips: 2-D 2x2, 2x4, 4x4, 4x8, ...; 3-D 2x2x1,
  2x2x2, 2x2x4, 2x4x4, 4x4x4, ... (the last of the smallest sides doubles)."""
  if dims == 2:
    x = 2 ** (int(math.log2(chip_count)) // 2)
    return [x, chip_count // x]
  shape = [2, 2, 1]
  while math.prod(shape) < chip_count:
    smallest = min(shape)
    shape[max(i for i, s in enumerate(shape) if s == smallest)] *= 2
  return shape


def _tpu_slice(name: str, text: str) -> Optional[Target]:
  generations = _tpu_generations()
  match = re.fullmatch(r'(v\d+[a-z]*)-(\d+)', text)
  if match:
    gen = generations.get(ALIASES.get(match.group(1), match.group(1)))
    if gen is None:
      return None
    shape, count = gen.slices, int(match.group(2))
    chip_count = count // 2 if shape.counts == 'cores' else count
    if ((shape.counts == 'cores' and count % 2) or chip_count < shape.min_chips
        or chip_count & (chip_count - 1)):
      unit = 'cores (2 per chip)' if shape.counts == 'cores' else 'chips'
      smallest = shape.min_chips * (2 if shape.counts == 'cores' else 1)
      raise UserError(f'no TPU slice {name!r}: the number after {match.group(1)}- counts {unit} '
                      f'and must be a power of two from {smallest}, e.g. '
                      f'{match.group(1)}-{smallest}, {match.group(1)}-{smallest * 4}')
    topology = f'{gen.target}:' + 'x'.join(map(str, _torus(chip_count, shape.dims)))
    return Target(name, gen, topology, chip_count * shape.devices_per_chip)
  match = re.fullmatch(r'(v\d+[a-z]*):(\d+(?:x\d+)+)', text)
  gen = match and generations.get(ALIASES.get(match.group(1), match.group(1)))
  if gen:
    chip_count = math.prod(int(s) for s in match.group(2).split('x'))
    return Target(name, gen, f'{gen.target}:{match.group(2)}',
                  chip_count * gen.slices.devices_per_chip)
  return None


def parse(name: str) -> Target:
  """Decodes a TPU slice, a TPU topology or a GPU name; an unknown or impossible one is a one-line
  UserError."""
  text = name.strip().lower()
  gpu_chip = _gpus().get(text)
  if gpu_chip is not None:
    return Target(name, gpu_chip, '1x1x1', 1)
  target = _tpu_slice(name, text)
  if target is None:
    raise _unknown(name)
  return target


def devices(target: Target) -> list:
  """The target's compile-only devices, from the compiler that describes it."""
  return _gpu_devices(target) if target.platform == 'gpu' else _tpu_devices(target)


def compiler_options(target: Optional[Target]) -> Optional[Dict[str, object]]:
  """The XLA options a compile for `target` needs (`.compile(compiler_options=...)`), or None."""
  return dict(DEVICELESS_OPTIONS) if target is not None and target.platform == 'gpu' else None


def find_libtpu() -> str:
  """The path of libtpu.so (see the module docstring), or a UserError saying how to install it."""
  path = os.environ.get('TPU_LIBRARY_PATH')
  if path and os.path.isfile(path):
    return path
  try:
    import libtpu  # pylint: disable=g-import-not-at-top,import-outside-toplevel  # libtpu: optional
    found = libtpu.get_library_path()
    if os.path.isfile(found):
      return found
  except (ImportError, AttributeError):
    pass
  path = os.path.join(sys.prefix, 'tpu-compiler', 'libtpu', 'libtpu.so')
  if os.path.isfile(path):
    return path
  raise UserError(f'compiling for a TPU slice needs libtpu, the TPU compiler, which is not '
                  f'installed: {INSTALL_HINT}')


# Set while libtpu starts on a machine without TPU chips: without them it queries the GCE
# metadata server (minutes of retries off GCE), logs errors about the missing TPU, and takes
# /tmp/libtpu_lockfile, so a second process compiling at the same time would fail.
_OFF_TPU_ENV = {'TPU_SKIP_MDS_QUERY': '1', 'TPU_WORKER_ID': '0',
                'TPU_WORKER_HOSTNAMES': 'localhost', 'ALLOW_MULTIPLE_LIBTPU_LOAD': '1'}


def _has_tpu_chips() -> bool:
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
    return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
  except Exception:  # pylint: disable=broad-except  # private API moved: assume a TPU VM
    return True


# The chips of one host, the TPU compiler's default for a topology: a slice smaller than it (a
# v5litepod-1 or -2) is one host holding the whole slice.
HOST_CHIPS = 4


def _host_bounds(target: Target) -> dict:
  """The compiler's `chips_per_host_bounds` for a slice of fewer chips than a host, else {}."""
  shape = [int(s) for s in target.topology.split(':')[1].split('x')]
  if math.prod(shape) >= HOST_CHIPS:
    return {}
  return {'chips_per_host_bounds': tuple(shape + [1] * (3 - len(shape)))}


def _tpu_devices(target: Target) -> list:
  """The devices of the slice, from the TPU compiler's description of its topology."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  library = find_libtpu()
  env = {'TPU_LIBRARY_PATH': library}
  if not _has_tpu_chips():
    env.update(_OFF_TPU_ENV, TPU_ACCELERATOR_TYPE=target.accelerator_type)
  saved = {k: os.environ.get(k) for k in env}
  for key, value in env.items():
    os.environ.setdefault(key, value)
  with quiet.silenced_stderr():
    try:
      topology = topologies.get_topology_desc(topology_name=target.topology, platform='tpu',
                                              chip_config_name=target.chip.slices.chip_config,
                                              **_host_bounds(target))
    except Exception as e:  # pylint: disable=broad-except  # the runtime's message says why
      reason = ' '.join(str(e).split())[:240]
      raise UserError(f'the TPU compiler ({library}) does not accept topology {target.topology} '
                      f'for {target.name!r} ({reason}): use an accelerator type '
                      f'({TPU_EXAMPLES})') from None
    finally:
      for key, value in saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value
  found = list(topology.devices)
  if len(found) != target.num_devices:
    raise UserError(f'the TPU compiler describes {target.topology} with {len(found)} devices, '
                    f'not the expected {target.num_devices}: report this slice name')
  return found


# The Hopper GPUs' device properties as CUDA's device query reports them (NVIDIA H100 and H200
# datasheets; both are the GH100 chip with 132 SMs); the memory and its bandwidth are the chip's;
# and the CUDA runtime of the CUDA 13 build (XLA picks cuBLASLt's fp8 GEMMs by it: without it a
# deviceless compile widens `model.fp8`'s fp8 dots to bf16 ones).
_HOPPER = """runtime_version {{ major: 13 }}
gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {cores}
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {bandwidth} l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }} registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
device_description_str: "{kind}"
"""


def gpu_target_config(chip: chips.Chip) -> str:
  """The `GpuTargetConfigProto` text that describes `chip` to the XLA:GPU compiler."""
  return _HOPPER.format(cores=chip.sm_count, bandwidth=int(chip.hbm_bytes_per_s),
                        memory=int(chip.hbm_bytes), kind=chip.kind)


def load_gpu_compiler(compiler_dir: Optional[str] = None) -> None:
  """Makes the XLA:GPU compiler of `make gpu-compiler` available to JAX; a one-line UserError when
  it is not installed. Called before JAX is imported (`bench --compile_for`), it only joins the
  import path: JAX finds the plugin when it starts, and cuDNN too where its library was put in
  the same folder. Called later (the trainer's `compile_for`), it registers the plugin after
  JAX's own backends, as a compiler only: no cuDNN there."""
  compiler_dir = compiler_dir or gpu.GPU_COMPILER_DIR
  plugins = os.path.join(compiler_dir, 'jax_plugins')
  names = sorted(n for n in os.listdir(plugins) if n.startswith('xla_cuda')) if os.path.isdir(
      plugins) else []
  if not names:
    raise UserError(f'compiling for an NVIDIA GPU without one needs the XLA:GPU compiler, which '
                    f'is not installed in {compiler_dir}: {GPU_COMPILER_HINT}')
  if compiler_dir not in sys.path:
    sys.path.insert(0, compiler_dir)
  os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')  # no CUDA libraries to check
  if 'jax' not in sys.modules:
    return  # JAX discovers the plugin on the import path when it starts
  import jax  # pylint: disable=g-import-not-at-top  # the table and names are read without JAX
  jax.devices()  # JAX's own backends first: the plugin registered after them never runs
  importlib.import_module(f'jax_plugins.{names[0]}').initialize()


def _gpu_devices(target: Target) -> list:
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  def describe():
    return topologies.get_topology_desc(platform='cuda', topology=target.topology,
                                        target_config=gpu_target_config(target.chip)).devices

  try:
    return list(describe())
  except NotImplementedError:  # no CUDA plugin in this process yet
    load_gpu_compiler()
    return list(describe())


__all__ = ['GPUS', 'Target', 'parse', 'devices', 'compiler_options', 'find_libtpu',
           'gpu_target_config', 'load_gpu_compiler', 'DEVICELESS_OPTIONS', 'LIBTPU_VERSION', 'INSTALL_HINT',
           'GPU_COMPILER_HINT', 'TPU_EXAMPLES']
