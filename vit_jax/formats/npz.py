"""Official .npz checkpoints (names of the original `models_vit.py`) <-> this project's param tree.

`load_npz(path)` reads any of these layouts ('/'-joined keys) into our tree (linen names):

  released   the original gs://vit_models files: pre-linen names in every encoder block
             (LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3)
  linen      our own names (MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0)
  big_vision keys under `params/` or `params/img/` (other keys are dropped), top-level
             `pos_embedding` [1,N,D] without a cls slot, optionally a scanned encoder
             (`Transformer/encoderblock/...` stacked on axis 0)
  opt/target old flax optimizer checkpoints: the keys under `opt/target/` (the optimizer state
             under `opt/state/` is dropped); the names below it are any of the above

Rules, in this order: strip the prefix; unstack a scanned encoder into encoderblock_{i}; rename
the pre-linen block children; squeeze hybrid GroupNorm params stored as [1,1,1,C] to [C]; move a
top-level `pos_embedding` to `Transformer/posembed_input/pos_embedding`. big_vision adds the
posemb to the patches before prepending cls, x = [cls; patches + pe], while our model adds it
after, x = [cls; patches] + pe'. Both compute the same function when pe' = [0; pe], so the cls
row of pe' is zeros when the file has a `cls` (and pe' = pe for a gap model without cls).

`save_npz(path, params)` writes the released layout (pre-linen block names, GroupNorm params as
[1,1,1,C]) through a temporary file and a rename. `check_params` / `load_for_model` compare a
loaded tree with a model's abstract params and explain any difference in one line. Every problem
with a file raises `UserError`. Files are always read with allow_pickle=False.
"""

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.formats import files
from vit_jax.errors import UserError
from vit_jax.models.layout import for_model, unstack_blocks

Params = Dict[str, Any]

POSEMB = 'Transformer/posembed_input/pos_embedding'
_BV_POSEMB = 'pos_embedding'
SCANNED = 'Transformer/encoderblock/'
PREFIXES = ('opt/target/', 'params/img/', 'params/')  # stripped: the first one a file has
# Children of Transformer/encoderblock_{i}: one counter across types (pre-linen) -> per type.
_FROM_RELEASED = {'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
                  'LayerNorm_2': 'LayerNorm_1', 'MlpBlock_3': 'MlpBlock_0'}
_TO_RELEASED = {'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
                'LayerNorm_1': 'LayerNorm_2', 'MlpBlock_0': 'MlpBlock_3'}
_BLOCK_CHILD = re.compile(r'^(Transformer/encoderblock_\d+/)([^/]+)(/.*)$')
# Hybrid and BiT GroupNorms (BiT: gn1..gn3 and norm-pre-head, stored [1,1,1,C] by bit_paper.py).
_GROUPNORM = re.compile(r'(^|/)(gn_root|gn_proj|gn\d+|norm-pre-head)/(scale|bias)$')
_FIX = files.FIX


def _flatten(tree: Any, prefix: str = '') -> Dict[str, Any]:
  """Nested mappings -> {'a/b/c': leaf}; empty mappings contribute nothing."""
  out = {}
  for key, value in tree.items():
    if not isinstance(key, str) or not key or '/' in key:
      raise UserError(f'param name {prefix}{key!r} cannot be stored in an .npz: names must be '
                      "non-empty strings without '/'")
    if isinstance(value, Mapping):
      out.update(_flatten(value, f'{prefix}{key}/'))
    else:
      out[prefix + key] = value
  return out


def _unflatten(flat: Mapping[str, Any]) -> Params:
  tree: Params = {}
  for key, value in flat.items():
    *parents, leaf = key.split('/')
    node = tree
    for i, name in enumerate(parents):
      node = node.setdefault(name, {})
      if not isinstance(node, dict):
        raise UserError(f'checkpoint key {key} clashes with the array {"/".join(parents[:i + 1])}:'
                        f' the file is not a param tree; {_FIX}')
    if leaf in node:
      raise UserError(f'checkpoint key {key} clashes with a subtree of the same name: {_FIX}')
    node[leaf] = value
  return tree


def _params_only(tree: Any) -> Any:
  """Accept flax `variables` ({'params': ...}) where a param tree is expected."""
  return tree['params'] if isinstance(tree, Mapping) and set(tree) == {'params'} else tree


def _put(out: Dict[str, Any], key: str, value: Any, source: str) -> None:
  if key in out:
    raise UserError(f'checkpoint has two arrays for {key} (one from {source}): '
                    'the file mixes layouts; re-export it in one layout')
  out[key] = value


def from_npz_layout(flat: Mapping[str, np.ndarray]) -> Tuple[Dict[str, np.ndarray], str]:
  """Flat file keys (any supported layout) -> (flat keys of our tree, layout description)."""
  flat = dict(flat)
  layout = []
  for prefix in PREFIXES:
    if any(k.startswith(prefix) for k in flat):
      flat = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
      layout.append(prefix.rstrip('/'))
      break
  big_vision = bool(layout and layout[0].startswith('params')) or _BV_POSEMB in flat

  scanned = {k: v for k, v in flat.items() if k.startswith(SCANNED)}
  out: Dict[str, np.ndarray] = {}
  if scanned:
    big_vision = True
    depths = {v.shape[0] if v.ndim else 0 for v in scanned.values()}
    if len(depths) != 1 or 0 in depths:
      raise UserError(f'scanned encoder {SCANNED}... has arrays with different numbers of layers '
                      f'{sorted(depths)} on axis 0: {_FIX}')
    for key, value in _flatten(unstack_blocks(_unflatten(scanned))).items():
      _put(out, key, value, SCANNED + '...')

  pre_linen = False
  for key, value in flat.items():
    if key in scanned:
      continue
    match = _BLOCK_CHILD.match(key)
    if match and match[2] in _FROM_RELEASED:
      pre_linen = True
      key = match[1] + _FROM_RELEASED[match[2]] + match[3]
    if (_GROUPNORM.search(key) and value.ndim == 4 and value.shape[:3] == (1, 1, 1)):
      value = value.reshape(value.shape[3:])
    _put(out, key, value, key)

  if _BV_POSEMB in out:
    pe = out.pop(_BV_POSEMB)
    if POSEMB in out:
      raise UserError(f'checkpoint has both a top-level {_BV_POSEMB} (big_vision) and {POSEMB}: '
                      'the file mixes layouts; re-export it in one layout')
    if pe.ndim != 3 or pe.shape[0] != 1:
      raise UserError(f'big_vision {_BV_POSEMB} has shape {pe.shape}, expected [1, tokens, width]:'
                      f' {_FIX}')
    if 'cls' in out:  # [cls; x + pe] == [cls; x] + [0; pe]
      pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
    out[POSEMB] = pe

  if big_vision:
    layout.append('big_vision' + (' (scanned)' if scanned else ''))
  else:
    layout.append('released' if pre_linen else 'linen')
  return out, ' '.join(layout)


def to_released_layout(flat: Mapping[str, Any], groupnorm_4d: bool = True) -> Dict[str, Any]:
  """Flat keys of our tree -> the released layout (pre-linen block names, GN [1,1,1,C])."""
  out: Dict[str, Any] = {}
  for key, value in flat.items():
    match = _BLOCK_CHILD.match(key)
    if match and match[2] in _TO_RELEASED:
      key = match[1] + _TO_RELEASED[match[2]] + match[3]
    elif match and match[2] in _FROM_RELEASED:
      raise UserError(f'param {key} already has a pre-linen name: save_npz expects this '
                      "project's tree (e.g. from load_npz or model.init)")
    if groupnorm_4d and _GROUPNORM.search(key) and value.ndim == 1:
      value = value.reshape(1, 1, 1, -1)
    _put(out, key, value, key)
  return out


def _read_member(npz, path: str, key: str) -> np.ndarray:
  try:
    array = npz[key]
  except MemoryError:
    raise
  except ValueError as e:
    if 'allow_pickle' in str(e) or 'Object arrays' in str(e):
      raise UserError(f'checkpoint {path} holds a pickled object array under {key}; it is not '
                      'loaded (pickles can run code): re-export the params as plain numeric '
                      'arrays') from None
    raise UserError(f'checkpoint {path} is corrupt or truncated ({key}: {files.describe(e)}): '
                    f'{_FIX}') from None
  except Exception as e:  # pylint: disable=broad-except  (zip, zlib, EOF, OS, tf errors)
    raise UserError(f'checkpoint {path} is corrupt or truncated ({key}: {files.describe(e)}): '
                    f'{_FIX}') from None
  if not isinstance(array, np.ndarray):  # numpy returns the bytes of a non-.npy zip member
    raise UserError(f'checkpoint {path} is a zip archive but {key} is not an .npy array: the '
                    'file is not an .npz of params; check the path')
  if array.dtype.kind not in 'biuf':
    hint = ' (probably bfloat16, which numpy stores untyped)' if array.dtype.kind == 'V' else ''
    raise UserError(f'checkpoint {path} has a non-numeric array {key} of dtype {array.dtype}'
                    f'{hint}: re-export the params as float32 arrays')
  return array


def read_npz_arrays(path: str) -> Dict[str, np.ndarray]:
  """Every array of the .npz at `path` (local or gs://), keys as stored; UserError if unusable."""
  path = os.fspath(path)
  with files.open_for_read(path, '.npz') as f:
    try:
      magic = f.read(6)
      f.seek(0)
      if not magic:
        raise UserError(f'checkpoint {path} is empty: {_FIX}')
      if magic == b'\x93NUMPY':
        raise UserError(f'checkpoint {path} is a single .npy array, not an .npz archive of '
                        'named params: save the param tree with save_npz')
      if not magic.startswith(b'PK'):
        raise UserError(f'checkpoint {path} is not an .npz file (not a zip archive): {_FIX}')
      npz = np.load(f, allow_pickle=False)
    except (UserError, MemoryError):
      raise
    except Exception as e:  # pylint: disable=broad-except  (BadZipFile, OSError, tf errors)
      raise UserError(f'checkpoint {path} is corrupt or truncated ({files.describe(e)}): '
                      f'{_FIX}') from None
    with npz:
      arrays = {key: _read_member(npz, path, key) for key in npz.files}
  if not arrays:
    raise UserError(f'checkpoint {path} holds no arrays: {_FIX}')
  return arrays


def read_npz(path: str) -> Tuple[Params, str]:
  """(params in this project's tree, layout description) of the .npz checkpoint at `path`."""
  flat, layout = from_npz_layout(read_npz_arrays(path))
  return _unflatten(flat), layout


def load_npz(path: str) -> Params:
  """The params (nested dict of numpy arrays, our linen names) of an .npz checkpoint."""
  return read_npz(path)[0]


def _as_numpy(key: str, value: Any) -> np.ndarray:
  array = np.asarray(jax.device_get(value))
  if array.dtype == jnp.bfloat16:  # numpy would store it as untyped |V2
    array = array.astype(np.float32)
  if array.dtype.kind not in 'biuf':
    raise UserError(f'param {key} has dtype {array.dtype}: only numeric arrays can be saved')
  return array


def save_npz(path: str, params: Any, *, groupnorm_4d: bool = True) -> None:
  """Writes `params` (our tree, or {'params': tree}) in the released layout, atomically. A
  scanned model's stacked blocks are written unrolled (encoderblock_{i}), as every released file.

  bfloat16 arrays are stored as float32. With groupnorm_4d, hybrid GroupNorm params are stored as
  [1,1,1,C] like the released files (every reader squeezes them).
  """
  path = os.fspath(path)
  flat = {k: _as_numpy(k, v) for k, v in _flatten(unstack_blocks(_params_only(params))).items()}
  if not flat:
    raise UserError('save_npz got an empty param tree: pass the model params')
  flat = to_released_layout(flat, groupnorm_4d)
  files.atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **flat))


def _few(keys: Sequence[str], n: int = 3) -> str:
  head = ', '.join(keys[:n])
  return f'{len(keys)} key{"s" if len(keys) > 1 else ""} ({head}{", ..." if len(keys) > n else ""})'


_ORDER = ('conv_root', 'gn_root', 'block', 'embedding', 'cls', 'Transformer', 'posembed_input',
          'encoderblock', 'encoder_norm', 'pre_logits', 'head', 'kernel', 'scale', 'bias')


def _forward_order(key: str) -> Tuple[Any, ...]:
  """Sort keys roughly in forward order: stem, embedding, cls, posemb, blocks by number, norm,
  head; kernel before scale before bias; anything else by name."""
  def part(name: str) -> Tuple[Any, ...]:
    match = re.fullmatch(r'(.*?)_?(\d+)', name)
    base, num = (match[1], int(match[2])) if match else (name, -1)
    return (_ORDER.index(base) if base in _ORDER else len(_ORDER), base, num, name)
  return tuple(part(name) for name in key.split('/'))


def _shape(x: Any) -> Tuple[int, ...]:
  return tuple(int(d) for d in np.shape(x))


def check_params(loaded: Any, expected: Any, *, what: str = 'the model') -> None:
  """UserError (one line) unless `loaded` has exactly the keys and shapes of `expected`.

  `expected` is usually `jax.eval_shape(model.init, ...)['params']` (ShapeDtypeStructs); both
  may be nested trees or flax variables {'params': ...}. Keys are reported in forward order (stem,
  embedding, blocks by number, head).
  """
  got = _flatten(_params_only(loaded))
  want = _flatten(_params_only(expected))
  got = {k: got[k] for k in sorted(got, key=_forward_order)}
  want = {k: want[k] for k in sorted(want, key=_forward_order)}
  mismatched = [(k, _shape(got[k]), _shape(v)) for k, v in want.items()
                if k in got and _shape(got[k]) != _shape(v)]
  missing = [k for k in want if k not in got]
  unexpected = [k for k in got if k not in want]
  if not (mismatched or missing or unexpected):
    return
  parts: List[str] = []
  if mismatched:
    key, file_shape, model_shape = mismatched[0]
    more = len(mismatched) - 1
    parts.append(f'{key} has shape {file_shape} in the file but {model_shape} in the model'
                 + (f'; {more} more mismatch{"es" if more > 1 else ""}' if more else ''))
  if missing:
    parts.append(f'missing from the file: {_few(missing)}')
  if unexpected:
    parts.append(f'in the file but not in the model: {_few(unexpected)}')
  hint = 'load it into the model it was trained as'
  top = lambda keys: {k.split('/')[0] for k in keys}
  if mismatched and top(k for k, _, _ in mismatched) == {'head'} and not missing + unexpected:
    hint = ('the number of classes differs; to fine-tune, drop head/ from the loaded params and '
            "keep the model's zero-initialised head")
  elif unexpected and top(unexpected) == {'pre_logits'} and not mismatched + missing:
    hint = ('the file has a pre_logits layer (i21k checkpoint): drop it, or create the model with '
            'representation_size set')
  elif mismatched and mismatched[0][0] == POSEMB and len(mismatched) == 1:
    hint = 'the file was trained at another image size: resize the position embedding'
  raise UserError(f'checkpoint does not fit {what}: {"; ".join(parts)}. To fix: {hint}')


def _model_name(model: Any) -> str:
  fields = ('hidden_size', 'num_layers', 'patch_size', 'num_classes')
  if all(hasattr(model, f) for f in fields):
    resnet = ' hybrid' if getattr(model, 'resnet', None) is not None else ''
    return (f'the{resnet} {type(model).__name__} (hidden {model.hidden_size}, '
            f'{model.num_layers} layers, patch {model.patch_size}, {model.num_classes} classes)')
  return f'the {type(model).__name__}'


def load_for_model(path: str, model: Any, image_shape: Sequence[int], *,
                   name: Optional[str] = None) -> Params:
  """load_npz + check_params against `model` on images of `image_shape` ([B,]H,W,C); the arrays
  are cast to the model's param dtypes. `name` (e.g. 'ViT-B/16') is used in the error message."""
  return fit_to_model(load_npz(path), model, image_shape, name=name)


def fit_to_model(params: Any, model: Any, image_shape: Sequence[int], *,
                 name: Optional[str] = None) -> Params:
  """check_params of `params` against `model` on images of `image_shape`, then a copy cast to the
  model's param dtypes (numpy arrays) in the model's encoder layout (stacked if it scans)."""
  params = for_model(_params_only(params), model)
  shape = tuple(int(d) for d in image_shape)
  images = jax.ShapeDtypeStruct((1,) * (len(shape) == 3) + shape, jnp.float32)
  init = lambda x: model.init(jax.random.key(0), x, train=False)['params']
  abstract = jax.eval_shape(init, images)
  check_params(params, abstract, what=name or _model_name(model))
  dtypes = _flatten(abstract)
  flat = {k: np.asarray(v).astype(dtypes[k].dtype, copy=False)
          for k, v in _flatten(_params_only(params)).items()}
  return _unflatten(flat)
