"""The encoder's two parameter layouts, and the one pair of functions between them.

  unrolled   Transformer/encoderblock_{i}/...   one subtree per block: the official names, and the
                                                only layout any file outside a training run holds
                                                (released .npz, timm, bundles)
  stacked    Transformer/encoderblock/...       every leaf [L, ...], block i at index i: the
                                                scanned encoder (`model.scan=True`; also
                                                big_vision's scanned checkpoints)

`stack_blocks` / `unstack_blocks` convert any pytree whose paths hold the block subtrees: params,
Adam's mu and nu, the Polyak average, a whole TrainState, sown intermediates, ShapeDtypeStructs
(their NamedSharding gains / loses a leading unsharded layer axis). Everything else is left as it
is, and a tree already in the target layout comes back unchanged. numpy leaves stay numpy.
"""

import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

BLOCK = 'encoderblock'  # the stacked subtree's name
_NUMBERED = re.compile(rf'^{BLOCK}_(\d+)$')


def _numbered(node) -> dict:
  """{i: key} of the encoderblock_{i} children of a mapping (empty for anything else)."""
  if not isinstance(node, Mapping):
    return {}
  return {int(m[1]): k for k in node if isinstance(k, str) for m in [_NUMBERED.match(k)] if m}


def _is_stacked_parent(node) -> bool:
  return isinstance(node, Mapping) and BLOCK in node


def _layer_sharding(sharding, add: bool):
  if not isinstance(sharding, NamedSharding):
    return sharding
  spec = tuple(sharding.spec)
  if add:
    return NamedSharding(sharding.mesh, P(None, *spec))
  if spec and spec[0] is not None:
    raise ValueError(f'cannot unstack an array sharded over its layer axis ({sharding.spec})')
  return NamedSharding(sharding.mesh, P(*spec[1:]))


def _stack(*leaves):
  first = leaves[0]
  if isinstance(first, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(leaves),) + tuple(first.shape), first.dtype,
                                sharding=_layer_sharding(first.sharding, add=True))
  if isinstance(first, jax.Array):
    return jnp.stack(leaves)
  return np.stack([np.asarray(x) for x in leaves])


def _unstack(leaf, depth: int):
  if isinstance(leaf, jax.ShapeDtypeStruct):
    sharding = _layer_sharding(leaf.sharding, add=False)
    return [jax.ShapeDtypeStruct(tuple(leaf.shape[1:]), leaf.dtype, sharding=sharding)] * depth
  if isinstance(leaf, jax.Array):
    return [leaf[i] for i in range(depth)]
  return list(np.asarray(leaf))


def _stack_node(node):
  numbered = _numbered(node)
  if not numbered:
    return node
  if BLOCK in node:
    raise ValueError(f'a tree holds both {BLOCK} and {BLOCK}_i subtrees')
  depth = len(numbered)
  if sorted(numbered) != list(range(depth)):
    raise ValueError(f'blocks {sorted(numbered)} are not numbered 0..{depth - 1}')
  out = {}
  for key, value in node.items():
    if key == numbered[0]:
      out[BLOCK] = jax.tree.map(_stack, *[node[numbered[i]] for i in range(depth)])
    elif key not in numbered.values():
      out[key] = value
  return out


def _unstack_node(node):
  if not _is_stacked_parent(node):
    return node
  if _numbered(node):
    raise ValueError(f'a tree holds both {BLOCK} and {BLOCK}_i subtrees')
  leaves, treedef = jax.tree.flatten(node[BLOCK])
  shapes = [tuple(leaf.shape) if hasattr(leaf, 'shape') else np.shape(leaf) for leaf in leaves]
  depths = {shape[0] if shape else 0 for shape in shapes}
  if len(depths) != 1 or 0 in depths:
    raise ValueError(f'stacked {BLOCK} leaves have layer axes of sizes {sorted(depths)}')
  depth = depths.pop()
  per_leaf = [_unstack(leaf, depth) for leaf in leaves]
  out = {}
  for key, value in node.items():
    if key == BLOCK:
      for i in range(depth):
        out[f'{BLOCK}_{i}'] = jax.tree.unflatten(treedef, [layers[i] for layers in per_leaf])
    else:
      out[key] = value
  return out


def _map_nodes(fn, match, tree):
  """`tree` with `fn` applied to its outermost nodes that `match`; dicts keep their key order."""
  if match(tree):
    return fn(tree)
  if isinstance(tree, dict):
    return type(tree)((k, _map_nodes(fn, match, v)) for k, v in tree.items())
  children, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)
  if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # a leaf
    return tree
  return jax.tree_util.tree_unflatten(treedef, [_map_nodes(fn, match, c) for c in children])


def stack_blocks(tree: Any) -> Any:
  """`tree` with every encoderblock_{i} family replaced by one `encoderblock` of stacked leaves."""
  return _map_nodes(_stack_node, lambda x: bool(_numbered(x)), tree)


def unstack_blocks(tree: Any) -> Any:
  """`tree` with every stacked `encoderblock` split into encoderblock_{i} (the official names)."""
  return _map_nodes(_unstack_node, _is_stacked_parent, tree)


def is_stacked(tree: Any) -> bool:
  """True if some path of `tree` passes through a stacked `encoderblock` (any pytree, including
  orbax's metadata trees)."""
  paths = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_stacked_parent)[0]
  return any(_is_stacked_parent(leaf) for _, leaf in paths)


def to_layout(tree: Any, stacked: bool) -> Any:
  """`tree` in the stacked (True) or unrolled (False) layout, whichever it is in now."""
  return stack_blocks(tree) if stacked else unstack_blocks(tree)


def for_model(params: Any, model: Any) -> Any:
  """`params` (either layout) in the layout of `model` (stacked iff it has `scan` set)."""
  return to_layout(params, bool(getattr(model, 'scan', False)))


__all__ = ['BLOCK', 'stack_blocks', 'unstack_blocks', 'is_stacked', 'to_layout', 'for_model']
