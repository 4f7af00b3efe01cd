"""The sharding policy, in one file: where parameters, optimizer state, batches and activations live.

Mesh axes (`vit_jax.parallel.mesh`): 'data' x 'fsdp' x 'model'.

  batches       the example axis is split over ('data', 'fsdp'); replicated over 'model'.
  parameters    tensor parallel over 'model' (`TENSOR_PARALLEL_RULES`: attention heads and MLP
                hidden units); then, if 'fsdp' > 1, every parameter with at least
                `FSDP_MIN_SIZE` elements is split over 'fsdp' along its largest remaining dimension
                that 'fsdp' divides; everything else replicated.
  optimizer     the same rule as the parameter it belongs to (the rule matches the end of the
                path, so Adam's mu/nu of `.../query/kernel` shard like the kernel); scalars
                (step counts) replicated.
  scanned       a scanned encoder's stacked leaves (`.../encoderblock/...`, [L, ...]; see
                vit_jax/models/layout.py) get the rules above on their trailing dims, exactly as
                one block of the unrolled encoder (the FSDP size threshold per layer too); the
                layer axis is never split, so each scan step gathers one layer as unrolled FSDP
                does.
  activations   the model names its activation axes (`constrain(x, ('batch', 'tokens', 'embed'))`);
                `ACTIVATION_RULES` maps the names to mesh axes. Constraints apply only while
                `activation_sharding(mesh)` is active (the jitted train/eval steps enter it), and
                an axis whose size the mesh axes do not divide is left unconstrained.

Pure data parallelism is the mesh (N, 1, 1); FSDP (1, N, 1) or (D, F, 1); tensor parallelism
(D, 1, M).
"""

import contextlib
import re
import threading
from typing import Any, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.errors import UserError

BATCH_AXES = ('data', 'fsdp')

# Logical activation axis -> mesh axes (None: replicated).
ACTIVATION_RULES = {
    'batch': BATCH_AXES,
    'tokens': None,
    'embed': None,
    'heads': 'model',
    'kv': None,
    'mlp': 'model',
}

# Parameter path suffix (regex) -> per-dimension mesh axis for the 'model' axis.
TENSOR_PARALLEL_RULES: Tuple[Tuple[str, Tuple[Optional[str], ...]], ...] = (
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$', (None, 'model', None)),
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/bias$', ('model', None)),
    (r'MultiHeadDotProductAttention_\d+/out/kernel$', ('model', None, None)),
    (r'MlpBlock_\d+/Dense_0/kernel$', (None, 'model')),
    (r'MlpBlock_\d+/Dense_0/bias$', ('model',)),
    (r'MlpBlock_\d+/Dense_1/kernel$', ('model', None)),
)

# Parameters smaller than this stay replicated under FSDP (norm scales, biases, cls, ...).
FSDP_MIN_SIZE = 2 ** 12
# A stacked leaf of a scanned encoder (the name models/layout.py gives it): [layers, ...].
_STACKED = re.compile(r'(^|/)encoderblock/')


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _axis_size(mesh, name: str) -> int:
  return int(mesh.shape.get(name, 1))


def path_string(path) -> str:
  """'params/Transformer/encoderblock_0/...' from a jax tree path."""
  parts = []
  for key in path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return '/'.join(parts)


def param_spec(path: str, shape: Sequence[int], mesh) -> P:
  """The PartitionSpec of one parameter (or optimizer-state leaf) named `path` of `shape`."""
  if shape and _STACKED.search(path):  # the rules of one layer, the layer axis whole
    return P(None, *_param_spec(path, tuple(shape[1:]), mesh))
  return _param_spec(path, shape, mesh)


def _param_spec(path: str, shape: Sequence[int], mesh) -> P:
  spec = [None] * len(shape)
  model = _axis_size(mesh, 'model')
  if model > 1:
    for pattern, axes in TENSOR_PARALLEL_RULES:
      if re.search(pattern, path) and len(axes) == len(shape):
        spec = [a if a is None or shape[i] % model == 0 else None for i, a in enumerate(axes)]
        break
  fsdp = _axis_size(mesh, 'fsdp')
  if fsdp > 1 and int(np.prod(shape, dtype=np.int64)) >= FSDP_MIN_SIZE:
    free = [i for i in range(len(shape)) if spec[i] is None and shape[i] % fsdp == 0]
    if free:
      spec[max(free, key=lambda i: (shape[i], -i))] = 'fsdp'
  return P(*spec)


def param_shardings(abstract_tree, mesh):
  """NamedShardings for a tree of parameters, optimizer state or a whole train state."""

  def one(path, leaf):
    shape = getattr(leaf, 'shape', ())
    return NamedSharding(mesh, param_spec(path_string(path), shape, mesh))

  return jax.tree_util.tree_map_with_path(one, abstract_tree)


def batch_sharding(mesh) -> NamedSharding:
  """Leading (example) axis split over ('data', 'fsdp'); the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def batch_ways(axis_sizes) -> int:
  """How many ways a batch is split on a mesh of these {axis: size} (the 'model' axis holds
  copies); the mesh need not exist yet (`xla_flags` asks before JAX's first device)."""
  return int(np.prod([int(axis_sizes.get(a, 1)) for a in BATCH_AXES]))


def batch_devices(mesh) -> int:
  """How many ways a batch is split on `mesh` (`batch_ways` of its shape)."""
  return batch_ways(mesh.shape)


def check_batch(global_batch: int, mesh, what: str = 'batch_size', flag: str = 'batch_size'):
  """Raises a UserError unless the global batch splits evenly over processes and devices."""
  ways = batch_devices(mesh)
  processes = jax.process_count()
  if global_batch % ways or global_batch % processes:
    unit = int(np.lcm(ways, processes))
    where = (f'{ways} batch shards (mesh data x fsdp)' if ways != mesh.devices.size
             else f'{ways} devices')
    below, above = global_batch // unit * unit, (global_batch // unit + 1) * unit
    sizes = f'{below} or {above}' if below else f'{above}'
    raise UserError(f'{what}={global_batch} does not split over {where} in {processes} '
                    f'processes: use a multiple of {unit}, e.g. config.{flag}={sizes}')


def shard_batch(local_batch: dict, mesh) -> dict:
  """Host-local numpy batch (this process's rows) -> global jax.Array split over the batch axes."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def state_bytes_per_device(abstract_tree, shardings) -> int:
  """Bytes of the largest per-device shard set of a tree (what each device stores)."""
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
    shard_shape = sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard_shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


# ---------------------------------------------------------------------------------------------
# Activations: logical names inside the model.

_ACTIVE = threading.local()


@contextlib.contextmanager
def activation_sharding(mesh):
  """While active (e.g. during tracing of a jitted step), `constrain` pins activations."""
  previous = getattr(_ACTIVE, 'mesh', None)
  _ACTIVE.mesh = mesh
  try:
    yield
  finally:
    _ACTIVE.mesh = previous


def active_mesh():
  """The mesh of the enclosing `activation_sharding`, or None (e.g. eager code, the pmap path)."""
  return getattr(_ACTIVE, 'mesh', None)


def with_activation_sharding(fn, mesh):
  """`fn` wrapped so that its trace runs under `activation_sharding(mesh)`."""

  def wrapped(*args, **kwargs):
    with activation_sharding(mesh):
      return fn(*args, **kwargs)

  return wrapped


def activation_spec(names: Sequence[Optional[str]], shape: Sequence[int], mesh) -> P:
  """PartitionSpec for an activation with logical axis `names` (unknown names: unconstrained)."""
  spec = []
  for name, size in zip(names, shape):
    axes = ACTIVATION_RULES.get(name) if name is not None else None
    if isinstance(axes, str):
      axes = (axes,)
    if axes:
      axes = tuple(a for a in axes if _axis_size(mesh, a) > 1)
      ways = int(np.prod([_axis_size(mesh, a) for a in axes])) if axes else 1
      if not axes or size % ways:
        axes = None
    spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
  return P(*spec)


def constrain(x: jax.Array, names: Sequence[Optional[str]]) -> jax.Array:
  """Pins `x` to the sharding its logical axis names give; a no-op outside `activation_sharding`."""
  mesh = active_mesh()
  if mesh is None or mesh.devices.size == 1:
    return x
  if len(names) != x.ndim:
    raise ValueError(f'{len(names)} axis names {tuple(names)} for an array of shape {x.shape}')
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(names, x.shape,
                                                                                  mesh)))


__all__ = ['ACTIVATION_RULES', 'TENSOR_PARALLEL_RULES', 'FSDP_MIN_SIZE', 'BATCH_AXES',
           'replicated', 'param_spec', 'param_shardings', 'batch_sharding', 'batch_devices',
           'check_batch', 'shard_batch', 'state_bytes_per_device', 'activation_sharding',
           'active_mesh', 'with_activation_sharding', 'activation_spec', 'constrain', 'path_string']
