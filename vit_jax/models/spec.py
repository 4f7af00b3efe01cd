"""What a set of params needs to become a runnable model: `ModelSpec`.

A spec is the variant name, the class count, the `create_model` options (the `model` section of a
training config), and the input resolution and channels. It is stored as JSON in inference bundles
and in the metadata of .safetensors files, so neither needs the training config.
"""

import dataclasses
import json
import math
from typing import Any, Dict, Mapping, Optional

import numpy as np

from vit_jax import lazy
from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models import variants

resnet_lib = lazy.Module('vit_jax.models.resnet')  # Flax: loaded when a model is built
vit_lib = lazy.Module('vit_jax.models.vit')

_FIELDS = ('model_name', 'num_classes', 'options', 'image_size', 'channels')
LAYOUT_OPTIONS = ('scan',)  # options that choose how params are laid out, not what they are


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  model_name: str
  num_classes: int
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  image_size: int = 224
  channels: int = 3

  def __post_init__(self):
    # Options as JSON stores them (tuples become lists), so a spec equals itself after a round trip.
    try:
      object.__setattr__(self, 'options', json.loads(json.dumps(dict(self.options))))
    except TypeError as e:
      raise UserError(f'model options must be plain values (numbers, strings, lists): {e}') \
          from None

  def build(self):
    """The flax module (vit_jax.models.create_model)."""
    return models.create_model(self.model_name, num_classes=self.num_classes, **self.options)

  def variant(self) -> Dict[str, Any]:
    """The decoded variant with the options applied (patch_size, hidden_size, num_heads, ...)."""
    model = self.build()
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model)
            if f.name not in ('parent', 'name')}

  def to_dict(self) -> Dict[str, Any]:
    """What files store (bundles, .safetensors metadata). Their params are always unrolled, so the
    stored options leave out `scan`, the encoder layout a run chose (vit_jax/models/layout.py)."""
    options = {k: v for k, v in self.options.items() if k not in LAYOUT_OPTIONS}
    return {'model_name': self.model_name, 'num_classes': int(self.num_classes),
            'options': options, 'image_size': int(self.image_size),
            'channels': int(self.channels)}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any], *, source: str) -> 'ModelSpec':
    missing = [k for k in _FIELDS if k not in d]
    if missing:
      raise UserError(f'{source} lacks the model description field(s) {", ".join(missing)}: '
                      're-export it with python -m vit_jax export')
    spec = cls(model_name=str(d['model_name']), num_classes=int(d['num_classes']),
               options=dict(d['options'] or {}), image_size=int(d['image_size']),
               channels=int(d['channels']))
    spec.build()  # unknown variant / option -> UserError now, not at first use
    return spec


def input_channels(params) -> int:
  """Image channels a model was trained on (from its first conv kernel: a hybrid's `conv_root`,
  a BiT's `root_block/conv_root`, a ViT's patch `embedding` or a Mixer's `stem`)."""
  for path in (('conv_root',), ('root_block', 'conv_root'), ('embedding',), ('stem',)):
    node = params
    for key in path:
      node = node.get(key) if hasattr(node, 'get') else None
    if node is not None:
      return int(np.shape(node['kernel'])[2])
  raise UserError('the checkpoint has no conv_root, root_block/conv_root or embedding kernel: '
                  'it is not the param tree of a model of this codebase')


def infer_options(params: Mapping[str, Any], model_name: Optional[str] = None
                  ) -> Dict[str, Any]:
  """create_model options that a released params file implies: classifier (cls token or not),
  num_registers, representation_size (pre_logits) and posemb (learned if stored, else sincos2d);
  with the variant `model_name`, FlexiViT's (`flexi_options`). A Mixer (MixerBlock_0) has none
  of these options."""
  if 'MixerBlock_0' in params:
    return {}
  if model_name is not None:
    return {**infer_options(params), **flexi_options(params, model_name)}
  pool = 'map' if 'MAPHead_0' in params else 'gap'
  options: Dict[str, Any] = {'classifier': 'token' if 'cls' in params else pool}
  if 'registers' in params:
    options['num_registers'] = int(np.shape(params['registers'])[1])
  if 'pre_logits' in params:
    options['representation_size'] = int(np.shape(params['pre_logits']['kernel'])[-1])
  if 'posembed_input' not in params.get('Transformer', {}):
    options['posemb'] = 'sincos2d'
  return options


def flexi_options(params: Mapping[str, Any], model_name: str) -> Dict[str, Any]:
  """FlexiViT options of a plain ViT's params whose patch kernel is not of the variant's patch
  size (a FlexiViT file, e.g. big_vision's 32x32 kernel read as ViT-B/16): flexi_patch (the
  kernel's side) and flexi_grid (the side of its learned position embedding's square grid)."""
  kernel = params.get('embedding', {}).get('kernel')
  if kernel is None or 'conv_root' in params or variants.family(model_name)[0] != \
      'VisionTransformer':
    return {}
  side = int(np.shape(kernel)[0])
  if side == variants.family(model_name)[1]['patch_size'][0]:
    return {}
  options = {'flexi_patch': side}
  posemb = params.get('Transformer', {}).get('posembed_input', {}).get('pos_embedding')
  if posemb is not None:
    tokens = int(np.shape(posemb)[1]) - int('cls' in params)
    options['flexi_grid'] = math.isqrt(tokens)
    if options['flexi_grid'] ** 2 != tokens:
      raise UserError(f'the position embedding has {tokens} patch tokens, not a square grid: '
                      f'the params are not a FlexiViT\'s')
  return options


def infer_image_size(params, model_name: str, options: Optional[Mapping[str, Any]] = None) -> int:
  """The square input size that gives the token count of a learned position embedding (a
  Mixer: of its token-mixing MLP)."""
  mixing = params.get('MixerBlock_0', {}).get('token_mixing', {}).get('Dense_0', {})
  if 'kernel' in mixing:
    side = math.isqrt(int(np.shape(mixing['kernel'])[0]))
    return side * models.create_model(model_name, num_classes=1).patch[0]
  posemb = params.get('Transformer', {}).get('posembed_input', {}).get('pos_embedding')
  if posemb is None or (options or {}).get('flexi_grid'):
    raise UserError('the checkpoint has no learned position embedding of its image size (none, '
                    'or a FlexiViT\'s of its own grid), so its image size is not stored: pass '
                    '--image_size')
  model = models.create_model(model_name, num_classes=1, **dict(options or {}))
  tokens = int(np.shape(posemb)[1]) - vit_lib.has_cls(model.classifier)
  side = math.isqrt(tokens)
  resnet = resnet_lib.as_resnet_config(model.resnet)
  stride = resnet.stride if resnet is not None else 1
  ph, pw = model.patch
  if side * side != tokens or ph != pw:
    raise UserError(f'the position embedding has {tokens} patch tokens, not a square grid of '
                    f'square patches: pass --image_size')
  return side * ph * stride
