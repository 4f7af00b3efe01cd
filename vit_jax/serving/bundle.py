"""Inference bundles: a model's params and what is needed to run them, without the training config.

A bundle is a directory:
  params.npz   the params in the released .npz layout (`save_npz`; readable by the original code
               and by timm's npz loader)
  model.json   {"format": "vit_jax.bundle", "version": 1, "model_name", "num_classes", "options"
               (create_model overrides), "image_size", "channels", "class_names",
               "preprocess": {"ops" (the eval op list, vit_jax/data/ops.py), "decode_channels",
               "sources" (the files that register its ops defined outside vit_jax)},
               "output": softmax | sigmoid,
               "source"}

`Bundle` is also what `predict`, `export` and `convert` load from any source (`resolve`): a training
run's workdir (model and preprocessing from its stored config, class names from its dataset), a
bundle, or a params file (.npz or .safetensors) plus a model name. Any of them runs at another
image size (`at_image_size`: the position embedding resized as `config.init` does).
"""

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from vit_jax.formats import files
from vit_jax.formats import npz
from vit_jax.formats import timm_layout
from vit_jax.formats import weights
from vit_jax.checkpoint import restore
from vit_jax.models import posemb_resize
from vit_jax.serving.paths import MODEL_FILE, PARAM_SUFFIXES, bundle_model_file
from vit_jax.models.spec import ModelSpec, infer_image_size, infer_options, input_channels
from vit_jax import tasks
from vit_jax.data import ops
from vit_jax.data import specs
from vit_jax.errors import UserError

FORMAT = 'vit_jax.bundle'
VERSION = 2  # version 1 described its preprocessing by crop and resize keys
PARAMS_FILE = 'params.npz'
OUTPUTS = ('softmax', 'sigmoid')


@dataclasses.dataclass
class Bundle:
  """Params and how to run them. `ops` is the eval preprocessing (a list of registered ops,
  vit_jax/data/ops.py; `op_sources`: the files that register those defined outside vit_jax);
  images are decoded to `decode_channels` first."""
  spec: ModelSpec
  params: Dict[str, Any]
  class_names: Tuple[str, ...]
  ops: str = 'resize'
  decode_channels: int = 3
  output: str = 'softmax'
  source: Dict[str, Any] = dataclasses.field(default_factory=dict)
  op_sources: Dict[str, str] = dataclasses.field(default_factory=dict)

  def eval_spec(self) -> specs.Spec:
    """The parsed eval ops, ending in the model's channels when they are not those decoded."""
    spec = specs.eval_spec(self.ops, self.spec.image_size)
    if spec.channels is None and self.decode_channels != self.spec.channels:
      spec = specs.eval_spec(f'{self.ops}|channels({self.spec.channels})', self.spec.image_size)
    return spec

  def to_json(self) -> Dict[str, Any]:
    return {'format': FORMAT, 'version': VERSION, **self.spec.to_dict(),
            'class_names': list(self.class_names),
            'preprocess': {'ops': self.ops, 'decode_channels': self.decode_channels,
                           'sources': self.op_sources},
            'output': self.output, 'source': self.source}


def fitted(spec: ModelSpec, params: Any, what: str) -> Dict[str, Any]:
  """`params` checked against the model of `spec` (one-line UserError if they do not fit)."""
  return npz.fit_to_model(params, spec.build(), (spec.image_size, spec.image_size, spec.channels),
                          name=f'{spec.model_name} ({what})')


def _index_names(num_classes: int) -> Tuple[str, ...]:
  return tuple(str(i) for i in range(num_classes))


def dataset_class_names(dataset: str, data_dir: Optional[str]) -> Tuple[str, ...]:
  """Class names of a dataset (a folder's are read from its listing, without preparing it)."""
  from vit_jax.data import folder, info  # pylint: disable=g-import-not-at-top  # imports tfds
  if dataset.startswith(folder.PREFIX):
    return folder.list_folder(os.path.abspath(dataset[len(folder.PREFIX):])).classes
  return tuple(info.get_info(dataset, data_dir).class_names)


def _class_names(config, step_dir, num_classes: int, data_dir: Optional[str]):
  """(class names, where they come from) of a run's checkpoint: the names recorded with it (what
  the run was trained on), else the dataset's as it is now, else the class indices."""
  recorded = (restore.load_facts(step_dir).get('data') or {}).get('class_names')
  if recorded and len(recorded) == num_classes:
    return tuple(recorded), f'dataset {config.dataset} (recorded with the checkpoint)'
  try:
    names = dataset_class_names(config.dataset, data_dir or config.data_dir)
    if len(names) != num_classes:
      raise UserError(f'it has {len(names)} classes, the model {num_classes}')
    return names, f'dataset {config.dataset}'
  except UserError as e:
    return (_index_names(num_classes),
            f'class indices (no names from dataset {config.dataset}: {e})')


def from_workdir(workdir: Optional[str], checkpoint: Optional[str] = None,
                 data_dir: Optional[str] = None) -> Bundle:
  """The bundle of a training run's checkpoint (newest step unless `checkpoint` names one), read
  safely beside the run that writes it (`restore.read_step`)."""
  return restore.read_step(workdir, checkpoint,
                           lambda step_dir: _from_step_dir(step_dir, data_dir))


def _from_step_dir(step_dir, data_dir: Optional[str]) -> Bundle:
  params, config = restore.load_checkpoint(step_dir)
  op_sources = restore.load_facts(step_dir).get('ops') or {}
  ops.OPS.load_sources(op_sources, str(step_dir))
  task = tasks.get_task(config)
  spec = task.model_spec(params)
  source = {'checkpoint': str(step_dir), 'dataset': config.dataset}
  names, source['class_names'] = _class_names(config, step_dir, spec.num_classes, data_dir)
  eval_spec = specs.eval_spec(config.pp.eval, config.image_size)
  return Bundle(spec=spec, params=fitted(spec, params, str(step_dir)), class_names=names,
                ops=config.pp.eval, op_sources=op_sources,
                decode_channels=spec.channels if eval_spec.channels is None else 3,
                output=task.output, source=source)


def from_params_file(path: str, *, model_name: Optional[str] = None,
                     options: Optional[Mapping[str, Any]] = None,
                     image_size: Optional[int] = None,
                     class_names: Optional[Sequence[str]] = None) -> Bundle:
  """The bundle of an .npz (any layout load_npz reads) or a timm .safetensors file.

  A .safetensors file written by this project carries its spec (and class names); otherwise
  `model_name` is needed. Options not given are inferred from the params (`infer_options`), the
  image size from the position embedding, the channels from the first conv.
  """
  path = os.fspath(path)
  stored, stored_names = None, None
  if path.endswith('.safetensors'):
    tensors, metadata = timm_layout.read_safetensors(path)
    stored = timm_layout.stored_spec(metadata, path)
    stored_names = timm_layout.stored_class_names(metadata, path)
    heads = None
    if model_name:
      heads = ModelSpec(model_name, 1, dict(options or {})).variant()['num_heads']
    elif stored is None:
      raise UserError(f'{path} does not say which model it holds: pass --model (e.g. ViT-B/16)')
    params = timm_layout.params_from_tensors(tensors, stored, num_heads=heads, path=path)
  elif path.endswith('.npz'):
    params = npz.load_npz(path)
  else:
    raise UserError(f'{path}: params files must end in {" or ".join(PARAM_SUFFIXES)}')
  if model_name or stored is None:
    if not model_name:
      raise UserError(f'{path} holds params only: pass the model it was trained as '
                      '(--model, e.g. ViT-B/16)')
    opts = {**infer_options(params, model_name), **dict(options or {})}
    learned = 'posembed_input' in params.get('Transformer', {}) and not opts.get('flexi_grid')
    size = infer_image_size(params, model_name, opts) if learned or not image_size else image_size
    if 'head' not in params:
      raise UserError(f'{path} has no head/ params: a classifier is needed to predict')
    spec = ModelSpec(model_name, int(np.shape(params['head']['kernel'])[-1]), opts, size,
                     input_channels(params))
  else:
    spec = stored
  if class_names is None:
    class_names = stored_names or _index_names(spec.num_classes)
  if len(class_names) != spec.num_classes:
    raise UserError(f'{len(class_names)} class names for a model with {spec.num_classes} '
                    'classes: give one name per class')
  bundle = Bundle(spec=spec, params=fitted(spec, params, path), class_names=tuple(class_names),
                  source={'checkpoint': path})
  return at_image_size(bundle, image_size) if image_size else bundle


def at_image_size(bundle: Bundle, image_size: int) -> Bundle:
  """`bundle` for images of `image_size`: the learned position embedding resized to the new
  patch grid, exactly as `config.init` transfers it (bilinear, models/posemb_resize.py); a resize
  before a crop scales with it."""
  old = bundle.spec.image_size
  if image_size == old:
    return bundle
  if image_size < 1:
    raise UserError(f'--image_size={image_size}: pass a positive number of pixels')
  spec = dataclasses.replace(bundle.spec, image_size=int(image_size))
  params = posemb_resize.params_at_image_size(bundle.params, spec.build(), old,
                                              spec.image_size)
  ops = specs.eval_spec(bundle.ops, old).ops.at_size(spec.image_size)
  return dataclasses.replace(bundle, spec=spec, ops=str(ops),
                             params=fitted(spec, params, f'at {image_size}x{image_size}'),
                             source={**bundle.source, 'resized_from': old})


def save(bundle: Bundle, out: str) -> None:
  """Writes the bundle directory `out` (created if needed; an existing bundle is replaced file by
  file, atomically; a directory holding anything else is refused)."""
  out = os.fspath(out)
  if os.path.isfile(out):
    raise UserError(f'--out={out} is a file: give a directory for the bundle')
  if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MODEL_FILE)):
    raise UserError(f'--out={out} is a non-empty directory that is not a bundle: give a new or '
                    'empty directory (nothing was written)')
  os.makedirs(out, exist_ok=True)
  npz.save_npz(os.path.join(out, PARAMS_FILE), bundle.params)
  text = json.dumps(bundle.to_json(), indent=1).encode()
  files.atomic_write(os.path.join(out, MODEL_FILE), lambda f: f.write(text))


def load(path: str) -> Bundle:
  """The bundle in directory `path`."""
  path = os.fspath(path)
  model_file = bundle_model_file(path)
  try:
    with open(model_file) as f:
      meta = json.load(f)
  except ValueError as e:
    raise UserError(f'{model_file} is not valid JSON ({e}): re-export the bundle') from None
  if not isinstance(meta, dict) or meta.get('format') != FORMAT:
    raise UserError(f'{model_file} is not a {FORMAT} description: re-export the bundle')
  if meta.get('version') != VERSION:
    raise UserError(f'{model_file} has bundle version {meta.get("version")}; this code reads '
                    f'version {VERSION}: re-export the bundle with this version')
  spec = ModelSpec.from_dict(meta, source=model_file)
  pp = meta.get('preprocess') or {}
  ops.OPS.load_sources(dict(pp.get('sources') or {}), model_file)
  names = tuple(str(n) for n in meta.get('class_names') or _index_names(spec.num_classes))
  if len(names) != spec.num_classes or meta.get('output', 'softmax') not in OUTPUTS:
    raise UserError(f'{model_file}: class_names or output do not fit the model: re-export it')
  params = npz.load_npz(os.path.join(path, PARAMS_FILE))
  return Bundle(spec=spec, params=fitted(spec, params, path), class_names=names,
                ops=pp.get('ops') or 'resize', op_sources=dict(pp.get('sources') or {}),
                decode_channels=int(pp.get('decode_channels', spec.channels)),
                output=meta.get('output', 'softmax'), source={'bundle': path})


def read_class_names(path: str) -> Tuple[str, ...]:
  """A text file with one class name per line (blank lines ignored)."""
  try:
    with open(path) as f:
      names = tuple(line.strip() for line in f if line.strip())
  except OSError as e:
    raise UserError(f'cannot read --class_names={path}: {e.strerror or e}') from None
  if not names:
    raise UserError(f'--class_names={path} holds no names: write one class name per line')
  return names



def at_patch_size(b: Bundle, patch_size: int) -> Bundle:
  """FlexiViT: `b` run at `patch_size` from the same params (its spec's `patch_size` option), for
  predict and export at that size; a one-line UserError for a model that is not a FlexiViT."""
  from vit_jax.models import flexi  # pylint: disable=g-import-not-at-top  # JAX
  flexi.at_patch_size(b.spec.build(), patch_size, b.spec.image_size)
  spec = dataclasses.replace(b.spec, options={**b.spec.options, 'patch_size': patch_size})
  return dataclasses.replace(b, spec=spec)


def resolve(*, workdir: Optional[str] = None, checkpoint: Optional[str] = None,
            bundle: Optional[str] = None, model: Optional[str] = None,
            options: Optional[Mapping[str, Any]] = None, image_size: Optional[int] = None,
            class_names: Optional[str] = None, data_dir: Optional[str] = None) -> Bundle:
  """The Bundle named by the CLI source flags: --bundle, --checkpoint FILE.npz|.safetensors (with
  --model unless the file says) or official weights by name (--checkpoint=ViT-B/16@imagenet21k),
  or --workdir [--checkpoint STEP|STEP_DIR]."""
  if not (workdir or checkpoint or bundle):
    raise UserError('no model given: pass --workdir=DIR (a training run), --bundle=DIR, or '
                    '--checkpoint=FILE.npz --model=NAME')
  if weights.is_name(checkpoint):  # official weights by name: their file, their variant
    image_size = image_size or weights.lookup(checkpoint).image_size
    checkpoint, model = weights.fetch_as(checkpoint, model)
  names = read_class_names(class_names) if class_names else None
  is_file = bool(checkpoint) and str(checkpoint).endswith(PARAM_SUFFIXES)
  if bundle:
    if workdir or checkpoint:
      raise UserError('pass one source: --bundle, or --workdir [--checkpoint], or --checkpoint '
                      'FILE --model NAME')
    result = load(bundle)
  elif is_file:
    if workdir:
      raise UserError(f'--checkpoint={checkpoint} is a params file: drop --workdir, or pass a '
                      'step number with --workdir')
    return from_params_file(checkpoint, model_name=model, options=options, image_size=image_size,
                            class_names=names)
  else:
    step_like = checkpoint is None or str(checkpoint).isdigit() or os.path.isdir(checkpoint)
    if not step_like:
      raise UserError(f'--checkpoint={checkpoint} is neither a params file '
                      f'({" or ".join(PARAM_SUFFIXES)}) nor a step number or step directory of '
                      f'a training run: pass one of those')
    if model or options:
      raise UserError('--model/--model_options apply to a params file (--checkpoint=FILE.npz); a '
                      "workdir's model comes from its config")
    result = from_workdir(workdir, checkpoint, data_dir)
  if names is not None:
    if len(names) != result.spec.num_classes:
      raise UserError(f'--class_names has {len(names)} names for a model with '
                      f'{result.spec.num_classes} classes: give one name per class')
    result.class_names = names
  return at_image_size(result, image_size) if image_size else result
