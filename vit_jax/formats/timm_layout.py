"""timm / PyTorch state dicts <-> this project's param tree, and .safetensors files of them.

The timm names are those of `timm.models.vision_transformer.VisionTransformer`; hybrids embed
through timm's `HybridEmbed` with a ResNetV2 backbone (`vision_transformer_hybrid.py`):

  ours                                        timm                                      layout
  cls                                         cls_token                                 same
  registers                                   reg_token                                 same
  Transformer/posembed_input/pos_embedding    pos_embed                                 same
  embedding/{kernel,bias}                     patch_embed.proj.{weight,bias}            HWIO->OIHW
  Transformer/encoderblock_i/
    LayerNorm_0, LayerNorm_1                  blocks.i.norm1, blocks.i.norm2            same
    MultiHeadDotProductAttention_0/
      {query,key,value}/kernel [D,H,D/H]      blocks.i.attn.qkv.weight [3D,D]           q;k;v rows
      {query,key,value}/bias [H,D/H]          blocks.i.attn.qkv.bias [3D]
      out/kernel [H,D/H,D]                    blocks.i.attn.proj.weight [D,D]           transposed
    MlpBlock_0/Dense_0, Dense_1               blocks.i.mlp.fc1, blocks.i.mlp.fc2        transposed
  Transformer/encoder_norm                    norm                                      same
  MAPHead_0/ (classifier 'map')               attn_pool.                                timm's
    probe                                       latent                                  AttentionPoolLatent
    MultiHeadDotProductAttention_0/query        q                                       [D,H,D/H]->[D,D]
    MultiHeadDotProductAttention_0/{key,value}  kv (k rows, then v rows)
    MultiHeadDotProductAttention_0/out          proj                                    transposed
    LayerNorm_0, MlpBlock_0/Dense_{0,1}         norm, mlp.fc{1,2}
  head                                        head                                      transposed
  hybrid stem (prefix patch_embed.backbone.; stem-only hybrids have no `stem.`):
  conv_root, gn_root                          stem.conv, stem.norm                      HWIO->OIHW
  block{s}/unit{u}/conv{n}, gn{n}             stages.{s-1}.blocks.{u-1}.conv{n}, norm{n}
  block{s}/unit{u}/conv_proj, gn_proj         stages.{s-1}.blocks.{u-1}.downsample.conv, .norm

Register tokens (`num_registers`): here they are added after the position embedding, which covers
the cls token and the patches. A model with registers maps to timm's layout of its released
reg-token models, `reg_tokens=R, no_embed_class=True` (pos_embed covers the patches only; the cls
row is added to cls_token, the same sum timm's forward would make). From timm, either layout
reads: with `no_embed_class=False` pos_embed also covers the registers, whose rows are added to
reg_token here (`_prefix_posemb_from_timm`).

LayerNorm / GroupNorm `scale` is timm's `weight`. `pre_logits` (i21k checkpoints) has no timm
counterpart: converting drops it only when asked (`drop_pre_logits`), as timm's own npz loader does.
A gap model maps to timm with global_pool='avg', class_token=False, fc_norm=False (the final norm
before pooling, as here). `from_timm` needs the number of heads, which a state dict does not hold.

`.safetensors` files are written with the `safetensors` package's numpy API (no torch needed) and
carry the `ModelSpec` and the matching timm constructor arguments as JSON metadata.
"""

import json
import math
import os
import re
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from vit_jax.formats import files
from vit_jax.formats import npz
from vit_jax.formats.npz import (  # pylint: disable=protected-access
    _as_numpy, _few, _flatten, _forward_order, _params_only, _unflatten)
from vit_jax.models.spec import ModelSpec
from vit_jax.errors import UserError
from vit_jax.models import resnet as resnet_lib
from vit_jax.models.layout import unstack_blocks
from vit_jax.models import vit as vit_lib

Params = Dict[str, Any]
METADATA_KEY = 'vit_jax'
_ATTN = 'MultiHeadDotProductAttention_0/'


def _same(x, _):
  return x


def _conv(x, _):  # HWIO <-> OIHW
  return x.transpose(3, 2, 0, 1)


def _conv_back(x, _):
  return x.transpose(2, 3, 1, 0)


def _dense(x, _):  # [in, out] <-> [out, in]
  return x.T


def _out(x, _):  # [H, D/H, D] -> [D, H*D/H]
  return x.reshape(-1, x.shape[-1]).T


def _out_back(x, heads):
  return x.T.reshape(heads, -1, x.shape[0])


def _heads_in(x, _):  # [D, H, D/H] -> [H*D/H, D]; biases [H, D/H] -> [H*D/H]
  return x.reshape(x.shape[0], -1).T if x.ndim == 3 else x.reshape(-1)


def _heads_in_back(x, heads):
  return x.T.reshape(x.shape[1], heads, -1) if x.ndim == 2 else x.reshape(heads, -1)


SAME, CONV, DENSE, OUT = (_same, _same), (_conv, _conv_back), (_dense, _dense), (_out, _out_back)
HEADS_IN = (_heads_in, _heads_in_back)

# (our key, timm key, (to timm, from timm)). {i} is the same number on both sides; {s}, {u} count
# from 1 here and from 0 in timm ({s-1}, {u-1}).
_BLOCK, _TBLOCK = 'Transformer/encoderblock_{i}/', 'blocks.{i}.'
_MAP, _TMAP = 'MAPHead_0/', 'attn_pool.'
_MAP_KV = (f'{_MAP}{_ATTN}key/', f'{_MAP}{_ATTN}value/')

def _out_norm_mlp(ours: str, theirs: str, proj: str, norm: str, tnorm: str) -> tuple:
  """Rules of an attention's out projection, the LayerNorm before the MLP and the MLP (an encoder
  block's, or the attention-pool head's)."""
  return ((ours + _ATTN + 'out/kernel', theirs + proj + '.weight', OUT),
          (ours + _ATTN + 'out/bias', theirs + proj + '.bias', SAME),
          (ours + norm + '/scale', theirs + tnorm + '.weight', SAME),
          (ours + norm + '/bias', theirs + tnorm + '.bias', SAME),
          (ours + 'MlpBlock_0/Dense_0/kernel', theirs + 'mlp.fc1.weight', DENSE),
          (ours + 'MlpBlock_0/Dense_0/bias', theirs + 'mlp.fc1.bias', SAME),
          (ours + 'MlpBlock_0/Dense_1/kernel', theirs + 'mlp.fc2.weight', DENSE),
          (ours + 'MlpBlock_0/Dense_1/bias', theirs + 'mlp.fc2.bias', SAME))


_VIT_RULES = (
    ('cls', 'cls_token', SAME),
    ('registers', 'reg_token', SAME),
    (npz.POSEMB, 'pos_embed', SAME),
    ('embedding/kernel', 'patch_embed.proj.weight', CONV),
    ('embedding/bias', 'patch_embed.proj.bias', SAME),
    (_BLOCK + 'LayerNorm_0/scale', _TBLOCK + 'norm1.weight', SAME),
    (_BLOCK + 'LayerNorm_0/bias', _TBLOCK + 'norm1.bias', SAME),
    *_out_norm_mlp(_BLOCK, _TBLOCK, 'attn.proj', 'LayerNorm_1', 'norm2'),
    ('Transformer/encoder_norm/scale', 'norm.weight', SAME),
    ('Transformer/encoder_norm/bias', 'norm.bias', SAME),
    ('head/kernel', 'head.weight', DENSE),
    ('head/bias', 'head.bias', SAME),
    (_MAP + 'probe', _TMAP + 'latent', SAME),
    (_MAP + _ATTN + 'query/kernel', _TMAP + 'q.weight', HEADS_IN),
    (_MAP + _ATTN + 'query/bias', _TMAP + 'q.bias', HEADS_IN),
    *_out_norm_mlp(_MAP, _TMAP, 'proj', 'LayerNorm_0', 'norm'),
)
_BACKBONE = 'patch_embed.backbone.'
_UNIT, _TUNIT = 'block{s}/unit{u}/', _BACKBONE + 'stages.{s-1}.blocks.{u-1}.'


def _root_rules(stem: str) -> Tuple[Tuple[str, str, Tuple[Callable, Callable]], ...]:
  return (('conv_root/kernel', stem + 'conv.weight', CONV),
          ('gn_root/scale', stem + 'norm.weight', SAME),
          ('gn_root/bias', stem + 'norm.bias', SAME))


_STEM_ONLY_RULES = _root_rules(_BACKBONE)
_RESNET_RULES = _root_rules(_BACKBONE + 'stem.') + (
    (_UNIT + 'conv{n}/kernel', _TUNIT + 'conv{n}.weight', CONV),
    (_UNIT + 'gn{n}/scale', _TUNIT + 'norm{n}.weight', SAME),
    (_UNIT + 'gn{n}/bias', _TUNIT + 'norm{n}.bias', SAME),
    (_UNIT + 'conv_proj/kernel', _TUNIT + 'downsample.conv.weight', CONV),
    (_UNIT + 'gn_proj/scale', _TUNIT + 'downsample.norm.weight', SAME),
    (_UNIT + 'gn_proj/bias', _TUNIT + 'downsample.norm.bias', SAME),
)
_PLACEHOLDER = re.compile(r'\{(\w)(-1)?\}')


def _pattern(template: str) -> re.Pattern:
  parts, last = [], 0
  for m in _PLACEHOLDER.finditer(template):
    parts += [re.escape(template[last:m.start()]), rf'(?P<{m[1]}{"_" if m[2] else ""}>\d+)']
    last = m.end()
  return re.compile(''.join(parts + [re.escape(template[last:])]) + '$')


def _fill(template: str, numbers: Mapping[str, int]) -> str:
  """Formats `template` from the numbers matched by `_pattern` of the other side's template."""
  def value(m):
    n = numbers[m[1]] if m[1] in numbers else numbers[m[1] + '_'] + 1  # x from x-1
    return str(n - 1 if m[2] else n)
  return _PLACEHOLDER.sub(value, template)


def _convert_names(flat: Mapping[str, np.ndarray], rules, *, to_timm: bool,
                   heads: int) -> Tuple[Dict[str, np.ndarray], list]:
  """Renames and re-lays every key matched by `rules`; returns (converted, unmatched keys)."""
  compiled = [(_pattern(ours if to_timm else theirs), theirs if to_timm else ours,
               fns[0] if to_timm else fns[1]) for ours, theirs, fns in rules]
  out, unmatched = {}, []
  for key, value in flat.items():
    for pattern, target, fn in compiled:
      m = pattern.match(key)
      if m:
        numbers = {k: int(v) for k, v in m.groupdict().items()}
        out[_fill(target, numbers)] = np.ascontiguousarray(fn(np.asarray(value), heads))
        break
    else:
      unmatched.append(key)
  return out, unmatched


def _hybrid_rules(keys) -> tuple:
  """The stem rules for our keys or timm keys: ResNet stages, stem only, or none (plain ViT)."""
  keys = list(keys)
  if any(re.match(rf'block\d+/|{re.escape(_BACKBONE)}(stem|stages)\.', k) for k in keys):
    return _RESNET_RULES
  if any(k.startswith(('conv_root/', _BACKBONE)) for k in keys):
    return _STEM_ONLY_RULES
  return ()


def to_timm(params: Any, *, drop_pre_logits: bool = False) -> Dict[str, np.ndarray]:
  """Our param tree (or {'params': tree}; either encoder layout) -> a timm state dict of numpy
  arrays (float32 for bfloat16 params)."""
  flat = {k: _as_numpy(k, v) for k, v in _flatten(unstack_blocks(_params_only(params))).items()}
  if any(k.startswith('pre_logits/') for k in flat):
    if not drop_pre_logits:
      raise UserError('the params have a pre_logits layer (i21k checkpoint), which timm\'s '
                      'VisionTransformer does not have: convert with drop_pre_logits=True '
                      '(--drop_pre_logits), as timm does when it loads such a file')
    flat = {k: v for k, v in flat.items() if not k.startswith('pre_logits/')}
  if 'registers' in flat and 'cls' in flat and npz.POSEMB in flat:  # timm's no_embed_class
    flat['cls'] = flat['cls'] + flat[npz.POSEMB][:, :1]
    flat[npz.POSEMB] = flat[npz.POSEMB][:, 1:]
  if 'registers' in flat and any(k.startswith(_MAP) for k in flat):
    raise UserError("timm's attention pool (global_pool='map') also attends to the register "
                    'tokens, which never reach the head here: convert a map model without '
                    'registers')
  encoder_qkv = re.compile(rf'Transformer/encoderblock_\d+/{_ATTN}(query|key|value)/')
  qkv = {key: flat.pop(key) for key in [k for k in flat if encoder_qkv.match(k)]}
  kv = {key: flat.pop(key) for key in [k for k in flat if k.startswith(_MAP_KV)]}
  rules = _VIT_RULES + _hybrid_rules(flat)
  out, unmatched = _convert_names(flat, rules, to_timm=True, heads=0)
  for kind in ('kernel', 'bias') if kv else ():
    out[f'{_TMAP}kv.{"weight" if kind == "kernel" else "bias"}'] = np.ascontiguousarray(
        np.concatenate([_heads_in(kv[f'{p}{kind}'], 0) for p in _MAP_KV], axis=0))
  if unmatched:
    raise UserError(f'cannot convert {_few(sorted(unmatched, key=_forward_order))} '
                    'to timm names: pass params of this project\'s ViT or hybrid')
  for i in sorted({int(re.search(r'encoderblock_(\d+)', k)[1]) for k in qkv}):
    att = f'Transformer/encoderblock_{i}/{_ATTN}'
    try:
      kernels = [qkv[f'{att}{n}/kernel'] for n in ('query', 'key', 'value')]
      biases = [qkv[f'{att}{n}/bias'] for n in ('query', 'key', 'value')]
    except KeyError as e:
      raise UserError(f'block {i} lacks {e.args[0]}: pass complete params') from None
    out[f'blocks.{i}.attn.qkv.weight'] = np.ascontiguousarray(
        np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels], axis=0))
    out[f'blocks.{i}.attn.qkv.bias'] = np.concatenate([b.reshape(-1) for b in biases])
  return out


def _is_square(n: int) -> bool:
  return n > 0 and math.isqrt(n) ** 2 == n


def _prefix_posemb_from_timm(flat: Dict[str, np.ndarray]) -> None:
  """Rewrites, in place, a timm pos_embed that does not cover exactly cls + patches into ours:
  no_embed_class=True (patches only: a zero cls row is prepended) or, with registers, rows for
  them too (added to reg_token and removed). The layout is told apart by which count of rows
  leaves a square patch grid."""
  pe, cls, reg = flat.get('pos_embed'), flat.get('cls_token'), flat.get('reg_token')
  if pe is None or cls is None or (reg is None and not _is_square(pe.shape[1])):
    return  # no posemb, a GAP model (prefix tokens never have rows) or cls + patches
  r = 0 if reg is None else reg.shape[1]
  if _is_square(pe.shape[1]) or not _is_square(pe.shape[1] - 1 - r):  # no_embed_class=True
    flat['pos_embed'] = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
  else:  # rows for cls, registers, patches
    flat['reg_token'] = reg + pe[:, 1:1 + r]
    flat['pos_embed'] = np.concatenate([pe[:, :1], pe[:, 1 + r:]], axis=1)


def from_timm(state_dict: Mapping[str, Any], *, num_heads: int) -> Params:
  """A timm state dict (numpy arrays or anything np.asarray takes) -> our param tree."""
  flat = {k: np.asarray(v) for k, v in state_dict.items()}
  if flat and all(k.startswith('module.') for k in flat):  # saved from a DataParallel wrapper
    flat = {k[len('module.'):]: v for k, v in flat.items()}
  if 'fc_norm.weight' in flat:
    raise UserError('the timm model has fc_norm (the final norm after pooling), which this '
                    "project's ViT does not have: convert a model built with fc_norm=False")
  _prefix_posemb_from_timm(flat)
  qkv_keys = [k for k in flat if re.fullmatch(r'blocks\.\d+\.attn\.qkv\.\w+', k)]
  qkv = {k: flat.pop(k) for k in qkv_keys}
  kv = {k: flat.pop(k) for k in (f'{_TMAP}kv.weight', f'{_TMAP}kv.bias') if k in flat}
  for key, value in qkv.items():
    if value.shape[0] % 3 or (value.shape[0] // 3) % num_heads:
      raise UserError(f'{key} has shape {value.shape}, which does not split into q, k, v of '
                      f'{num_heads} heads: pass the model (--model) the file was trained as')
  out, unmatched = _convert_names(flat, _VIT_RULES + _hybrid_rules(flat), to_timm=False,
                                  heads=num_heads)
  if unmatched:
    raise UserError(f'the timm state dict has keys this project\'s ViT does not have: '
                    f'{_few(sorted(unmatched))}; convert a plain ViT or ViT hybrid '
                    '(no layer scale, qk-norm or attention pooling)')
  for key, value in kv.items():
    kind = 'kernel' if key.endswith('weight') else 'bias'
    for prefix, part in zip(_MAP_KV, np.split(value, 2, axis=0)):
      out[f'{prefix}{kind}'] = np.ascontiguousarray(_heads_in_back(part, num_heads))
  for key, value in qkv.items():
    i, kind = re.fullmatch(r'blocks\.(\d+)\.attn\.qkv\.(\w+)', key).groups()
    att = f'Transformer/encoderblock_{i}/{_ATTN}'
    width = value.shape[0] // 3
    for name, part in zip(('query', 'key', 'value'), np.split(value, 3, axis=0)):
      if kind == 'weight':
        out[f'{att}{name}/kernel'] = np.ascontiguousarray(part.T.reshape(-1, num_heads,
                                                                         width // num_heads))
      else:
        out[f'{att}{name}/bias'] = part.reshape(num_heads, width // num_heads)
  return _unflatten(out)


# ---------------------------------------------------------------------------------------------
# Which timm model the converted params fit.

_TIMM_BASES = {'Ti': 'tiny', 'S': 'small', 'B': 'base', 'L': 'large', 'H': 'huge'}
_TIMM_HYBRIDS = {'R50+ViT-B/16': 'vit_base_r50_s16_224', 'R50+ViT-L/32': 'vit_large_r50_s32_224',
                 'R26+ViT-S/32': 'vit_small_r26_s32_224', 'R26+ViT-B/32': 'vit_base_r26_s32_224',
                 'R+ViT-Ti/16': 'vit_tiny_r_s16_p8_224'}


def timm_config(spec: ModelSpec) -> Dict[str, Any]:
  """{'architecture': timm model name or None, 'kwargs': constructor arguments, 'resnet': stem
  stages or None}. `timm.create_model(architecture, **kwargs)` (or, without an architecture and
  resnet, `timm.models.vision_transformer.VisionTransformer(**kwargs)`) builds a timm model that
  loads the state dict of `to_timm`."""
  v = spec.variant()
  resnet = resnet_lib.as_resnet_config(v['resnet'])
  ph, pw = v['patch_size']
  pool = {'token': 'token', 'gap': 'avg', 'unpooled': '', 'map': 'map'}[v['classifier']]
  kwargs = dict(img_size=spec.image_size, patch_size=ph if ph == pw else [ph, pw],
                in_chans=spec.channels, num_classes=spec.num_classes, embed_dim=v['hidden_size'],
                depth=v['num_layers'], num_heads=v['num_heads'],
                mlp_ratio=v['mlp_dim'] / v['hidden_size'], global_pool=pool,
                class_token=vit_lib.has_cls(v['classifier']), fc_norm=False,
                pos_embed='none' if v['posemb'] == 'none' else 'learn',
                act_layer='gelu_tanh' if v['gelu_approximate'] else 'gelu')
  if v['num_registers']:
    kwargs.update(reg_tokens=v['num_registers'], no_embed_class=True)
  arch = None
  if resnet is not None:
    arch = _TIMM_HYBRIDS.get(spec.model_name)
  else:
    m = re.fullmatch(r'ViT-(\w+)/(\d+)', spec.model_name)
    if m and m[1] in _TIMM_BASES:
      arch = f'vit_{_TIMM_BASES[m[1]]}_patch{m[2]}_224'
  return {'architecture': arch, 'kwargs': kwargs,
          'resnet': None if resnet is None else list(resnet.num_layers)}


def _posemb_table(spec: ModelSpec) -> np.ndarray:
  """The fixed sincos2d posemb of `spec` as timm's learned pos_embed [1, N(+1), D]."""
  v = spec.variant()
  resnet = resnet_lib.as_resnet_config(v['resnet'])
  stride = resnet.stride if resnet is not None else 1
  grid = (spec.image_size // (v['patch_size'][0] * stride),
          spec.image_size // (v['patch_size'][1] * stride))
  table = vit_lib.sincos2d_posemb(*grid, v['hidden_size'])
  if vit_lib.has_cls(v['classifier']) and not v['num_registers']:  # else: patches only
    table = np.concatenate([np.zeros_like(table[:1]), table])
  return table[None]


# ---------------------------------------------------------------------------------------------
# .safetensors files.

_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'I64': np.int64,
           'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}


def save_safetensors(path: str, params: Any, *, spec: Optional[ModelSpec] = None,
                     class_names: Optional[Sequence[str]] = None,
                     drop_pre_logits: bool = False) -> Dict[str, np.ndarray]:
  """Writes `params` as a timm state dict (.safetensors), atomically; returns the state dict.

  With `spec`, the file's metadata holds it, the timm constructor arguments (`timm_config`) and
  `class_names`, and a fixed sincos2d posemb is written as timm's (learned) pos_embed.
  """
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  state = to_timm(params, drop_pre_logits=drop_pre_logits)
  metadata = {'format': 'pt'}  # what torch-side loaders (transformers, timm) expect
  if spec is not None:
    if spec.options.get('posemb') == 'sincos2d':
      state['pos_embed'] = _posemb_table(spec).astype(np.float32)
    info = {'spec': spec.to_dict(), 'timm': timm_config(spec)}
    if class_names is not None:
      info['class_names'] = list(class_names)
    metadata[METADATA_KEY] = json.dumps(info)
  data = safetensors.numpy.save(state, metadata=metadata)
  files.atomic_write(os.fspath(path), lambda f: f.write(data))
  return state


def read_safetensors(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
  """(tensors as stored, metadata) of a .safetensors file; bfloat16 tensors become float32."""
  import safetensors  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  with files.open_for_read(path, '.safetensors') as f:
    data = f.read()
  if not data:
    raise UserError(f'checkpoint {path} is empty: {files.FIX}')
  try:
    header_len = int.from_bytes(data[:8], 'little')
    metadata = json.loads(data[8:8 + header_len]).get('__metadata__') or {}
    entries = safetensors.deserialize(data)
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError, JSON, unicode)
    raise UserError(f'checkpoint {path} is not a readable .safetensors file ({files.describe(e)})'
                    f': {files.FIX}') from None
  tensors = {}
  for name, entry in entries:
    dtype = entry['dtype']
    if dtype == 'BF16':
      array = np.frombuffer(entry['data'], ml_dtypes.bfloat16).astype(np.float32)
    elif dtype in _DTYPES:
      array = np.frombuffer(entry['data'], _DTYPES[dtype]).copy()
    else:
      raise UserError(f'checkpoint {path} stores {name} as {dtype}: re-export it as float32')
    tensors[name] = array.reshape(entry['shape'])
  if not tensors:
    raise UserError(f'checkpoint {path} holds no tensors: {files.FIX}')
  return tensors, metadata


def _stored(metadata: Mapping[str, str], path: str) -> Optional[dict]:
  if METADATA_KEY not in metadata:
    return None
  try:
    info = json.loads(metadata[METADATA_KEY])
    if isinstance(info, dict) and isinstance(info.get('spec'), dict):
      return info
  except ValueError:
    pass
  raise UserError(f'{path}: the {METADATA_KEY} metadata is not valid JSON with a spec: '
                  're-export the file')


def stored_spec(metadata: Mapping[str, str], path: str) -> Optional[ModelSpec]:
  """The ModelSpec written by save_safetensors, or None for a file from elsewhere."""
  info = _stored(metadata, path)
  return None if info is None else ModelSpec.from_dict(info['spec'], source=path)


def stored_class_names(metadata: Mapping[str, str], path: str) -> Optional[Tuple[str, ...]]:
  info = _stored(metadata, path)
  names = None if info is None else info.get('class_names')
  return None if names is None else tuple(str(n) for n in names)


def params_from_tensors(tensors: Mapping[str, np.ndarray], spec: Optional[ModelSpec], *,
                        num_heads: Optional[int], path: str) -> Params:
  """from_timm with the heads of `num_heads` or else `spec`; drops the pos_embed table that
  save_safetensors wrote for a sincos2d spec."""
  if num_heads is None:
    if spec is None:
      raise UserError(f'{path} does not say how many attention heads the model has: pass the '
                      'model name (--model=ViT-B/16)')
    num_heads = spec.variant()['num_heads']
  params = from_timm(tensors, num_heads=num_heads)
  if spec is not None and spec.options.get('posemb') == 'sincos2d':
    params.get('Transformer', {}).pop('posembed_input', None)
  return params


def load_safetensors(path: str, *, num_heads: Optional[int] = None
                     ) -> Tuple[Params, Optional[ModelSpec]]:
  """(our param tree, the stored ModelSpec or None) of a timm .safetensors file. `num_heads` is
  needed unless the file was written by save_safetensors with a spec."""
  tensors, metadata = read_safetensors(path)
  spec = stored_spec(metadata, path)
  return params_from_tensors(tensors, spec, num_heads=num_heads, path=path), spec


__all__ = ['to_timm', 'from_timm', 'timm_config', 'save_safetensors', 'load_safetensors',
           'read_safetensors', 'stored_spec', 'stored_class_names', 'params_from_tensors']
