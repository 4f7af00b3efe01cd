"""Compile targets: the devices a program is compiled for, here or on a TPU slice that is not here.

`compile_for` (a config value) names a Cloud TPU slice the way `gcloud` does (`v3-8`, `v4-32`,
`v5litepod-16`, `v5p-128`, `v6e-8`) or a topology the way the TPU runtime does (`v3:4x4`,
`v4:2x2x2`, `v5e:2x4`). `tpu_slice(name)` decodes it (one table, `GENERATIONS`) and
`slice_devices(spec)` hands out that slice's devices without hardware: the TPU compiler (the
`libtpu` wheel on PyPI) describes the topology, and `jax.jit(...).lower(...).compile()` on a mesh
of those devices runs the real TPU compiler ahead of time, so its memory figures are the TPU's.

Where libtpu comes from, first match wins: `TPU_LIBRARY_PATH`; an importable `libtpu` package (a
Cloud TPU VM with `jax[tpu]`); `<venv>/tpu-compiler/libtpu/libtpu.so`, which `make tpu-compiler`
installs from `requirements-tpu.lock`. It is kept out of the venv's import path on purpose: with
libtpu importable, every JAX process looks for TPU chips at start-up and logs errors when none
are there.
"""

import dataclasses
import math
import os
import re
import sys
from typing import List, Optional

from vit_jax import quiet
from vit_jax.errors import UserError

GIB = 2 ** 30
LIBTPU_VERSION = '0.0.42.1'  # requirements-tpu.lock; the libtpu that jax 0.10.2's `tpu` extra names
INSTALL_HINT = ("run `make tpu-compiler` (installs requirements-tpu.lock into .venv/tpu-compiler), "
                f"or `pip install libtpu=={LIBTPU_VERSION}` and set TPU_LIBRARY_PATH to its libtpu.so")


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation as Cloud TPU sells it."""
  kind: str            # the device_kind the TPU runtime reports
  counts: str          # what the number in 'v3-8' counts: 'cores' (2 per chip) or 'chips'
  dims: int            # torus dimensions of a topology name ('v3:4x4' 2, 'v4:2x2x2' 3)
  devices_per_chip: int  # JAX devices per chip (v2/v3: one per core; megacore chips: one)
  hbm_gib: float       # HBM per JAX device (per core on v2/v3, per chip otherwise)
  min_chips: int


GENERATIONS = {
    'v2': Generation('TPU v2', 'cores', 2, 2, 8, 4),
    'v3': Generation('TPU v3', 'cores', 2, 2, 16, 4),
    'v4': Generation('TPU v4', 'cores', 3, 1, 32, 4),
    'v5p': Generation('TPU v5', 'cores', 3, 1, 95, 4),
    'v5e': Generation('TPU v5 lite', 'chips', 2, 1, 16, 1),
    'v6e': Generation('TPU v6 lite', 'chips', 2, 1, 32, 1),
}
ALIASES = {'v5litepod': 'v5e'}  # the names gcloud sells a generation under
EXAMPLES = 'v3-8, v3-32 ... v3-2048, v4-8, v5litepod-16, v5p-128, v6e-8, or a topology like v3:4x4'


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  name: str            # as the user wrote it
  generation: str      # key of GENERATIONS
  topology: str        # what the TPU runtime takes, e.g. 'v3:8x16'
  num_devices: int     # JAX devices of the slice (cores on v2/v3, chips otherwise)

  @property
  def accelerator_type(self) -> str:
    """The slice as `gcloud --accelerator-type` names it ('v3-8', 'v5litepod-16')."""
    gen = GENERATIONS[self.generation]
    chips = self.num_devices // gen.devices_per_chip
    count = chips * 2 if gen.counts == 'cores' else chips
    sold_as = next((a for a, g in ALIASES.items() if g == self.generation), self.generation)
    return f'{sold_as}-{count}'

  @property
  def hbm_bytes(self) -> int:
    return int(GENERATIONS[self.generation].hbm_gib * GIB)

  @property
  def device_kind(self) -> str:
    return GENERATIONS[self.generation].kind

  def describe(self) -> str:
    unit = 'core' if GENERATIONS[self.generation].devices_per_chip > 1 else 'chip'
    return (f'{self.name} ({self.device_kind}, topology {self.topology}, {self.num_devices} '
            f'{unit}s, {GENERATIONS[self.generation].hbm_gib:g} GiB HBM per {unit})')


def _torus(chips: int, dims: int) -> List[int]:
  """The torus Cloud TPU builds for `chips` chips: 2-D 2x2, 2x4, 4x4, 4x8, ...; 3-D 2x2x1,
  2x2x2, 2x2x4, 2x4x4, 4x4x4, ... (the last of the smallest sides doubles)."""
  if dims == 2:
    x = 2 ** (int(math.log2(chips)) // 2)
    return [x, chips // x]
  shape = [2, 2, 1]
  while math.prod(shape) < chips:
    smallest = min(shape)
    shape[max(i for i, s in enumerate(shape) if s == smallest)] *= 2
  return shape


def tpu_slice(name: str) -> TpuSlice:
  """Decodes a slice or topology name; an unknown or impossible one is a one-line UserError."""
  text = name.strip().lower()
  bad = f'unknown TPU slice {name!r} in config.compile_for: use an accelerator type ({EXAMPLES})'
  match = re.fullmatch(r'(v\d+[a-z]*)-(\d+)', text)
  if match:
    gen_name = ALIASES.get(match.group(1), match.group(1))
    if gen_name not in GENERATIONS:
      raise UserError(bad)
    gen, count = GENERATIONS[gen_name], int(match.group(2))
    chips = count // 2 if gen.counts == 'cores' else count
    if (gen.counts == 'cores' and count % 2) or chips < gen.min_chips or chips & (chips - 1):
      unit = 'cores (2 per chip)' if gen.counts == 'cores' else 'chips'
      smallest = gen.min_chips * (2 if gen.counts == 'cores' else 1)
      raise UserError(f'no TPU slice {name!r}: the number after {match.group(1)}- counts {unit} '
                      f'and must be a power of two from {smallest}, e.g. '
                      f'{match.group(1)}-{smallest}, {match.group(1)}-{smallest * 4}')
    topology = f'{gen_name}:' + 'x'.join(map(str, _torus(chips, gen.dims)))
    return TpuSlice(name, gen_name, topology, chips * gen.devices_per_chip)
  match = re.fullmatch(r'(v\d+[a-z]*):(\d+(?:x\d+)+)', text)
  if match and ALIASES.get(match.group(1), match.group(1)) in GENERATIONS:
    gen_name = ALIASES.get(match.group(1), match.group(1))
    gen = GENERATIONS[gen_name]
    chips = math.prod(int(s) for s in match.group(2).split('x'))
    return TpuSlice(name, gen_name, f'{gen_name}:{match.group(2)}', chips * gen.devices_per_chip)
  raise UserError(bad)


def find_libtpu() -> str:
  """The path of libtpu.so (see the module docstring), or a UserError saying how to install it."""
  path = os.environ.get('TPU_LIBRARY_PATH')
  if path and os.path.isfile(path):
    return path
  try:
    import libtpu  # pylint: disable=g-import-not-at-top,import-outside-toplevel
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


def slice_devices(spec: TpuSlice) -> list:
  """The devices of the slice, from the TPU compiler's description of its topology."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  library = find_libtpu()
  env = {'TPU_LIBRARY_PATH': library}
  if not _has_tpu_chips():
    env.update(_OFF_TPU_ENV, TPU_ACCELERATOR_TYPE=spec.accelerator_type)
  saved = {k: os.environ.get(k) for k in env}
  for key, value in env.items():
    os.environ.setdefault(key, value)
  with quiet.silenced_stderr():
    try:
      topology = topologies.get_topology_desc(topology_name=spec.topology, platform='tpu')
    except Exception as e:  # pylint: disable=broad-except  # the runtime's message says why
      reason = ' '.join(str(e).split())[:240]
      raise UserError(f'the TPU compiler ({library}) does not accept topology {spec.topology} '
                      f'for {spec.name!r} ({reason}): use an accelerator type ({EXAMPLES})'
                      ) from None
    finally:
      for key, value in saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value
  devices = list(topology.devices)
  if len(devices) != spec.num_devices:
    raise UserError(f'the TPU compiler describes {spec.topology} with {len(devices)} devices, '
                    f'not the expected {spec.num_devices}: report this slice name')
  return devices


def describe_devices(devices) -> str:
  """'8 CPU devices' / 'TPU v3 x 8' for report headers."""
  kind = getattr(devices[0], 'device_kind', devices[0].platform)
  return f'{len(devices)} x {kind}'


def hbm_of(devices) -> Optional[int]:
  """HBM bytes per device when `devices` are TPUs of a known generation, else None."""
  kind = getattr(devices[0], 'device_kind', '')
  for gen in GENERATIONS.values():
    if gen.kind == kind:
      return int(gen.hbm_gib * GIB)
  return None


__all__ = ['GENERATIONS', 'TpuSlice', 'tpu_slice', 'find_libtpu', 'slice_devices', 'hbm_of',
           'describe_devices', 'LIBTPU_VERSION', 'INSTALL_HINT']
