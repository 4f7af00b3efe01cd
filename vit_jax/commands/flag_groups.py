"""The flags that name a model to load, shared by `predict`, `export` and `convert`.

  --workdir=DIR [--checkpoint=STEP|STEP_DIR]     a training run (newest step by default)
  --bundle=DIR                                   an exported inference bundle
  --checkpoint=FILE.npz|FILE.safetensors --model=NAME [--model_options=k=v,...] [--image_size=S]
                                                 a params file (a .safetensors written by this
                                                 project needs no --model)
  --class_names=FILE                             one class name per line (overrides the source's)
"""

import json

from absl import flags

from vit_jax.errors import UserError

_WORKDIR = flags.DEFINE_string('workdir', None, 'Training run directory (holds checkpoints/).')
_CHECKPOINT = flags.DEFINE_string(
    'checkpoint', None, 'Step number or step directory of --workdir, or a params file '
    '(.npz in any official layout, or timm .safetensors).')
_BUNDLE = flags.DEFINE_string('bundle', None, 'Inference bundle directory (python -m '
                              'vit_jax.export).')
_MODEL = flags.DEFINE_string('model', None, 'Variant of a params file, e.g. ViT-B/16.')
_MODEL_OPTIONS = flags.DEFINE_string(
    'model_options', None, 'create_model options of a params file, e.g. classifier=gap,'
    'posemb=learned (by default inferred from the params).')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', None, 'Input size of a params file; default: '
                                   'from its position embedding.')
_CLASS_NAMES = flags.DEFINE_string('class_names', None, 'Text file, one class name per line.')
_DATA_DIR = flags.DEFINE_string('data_dir', None, "tfds data_dir for the run's class names; "
                                "default: the run's config.")


def parse_options(text):
  """'k=v,k=v' -> dict; values are JSON when they parse (3, 0.1, true, null), else strings."""
  out = {}
  for item in filter(None, (text or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise UserError(f'--model_options item {item!r} is not key=value (e.g. classifier=gap)')
    try:
      out[key] = json.loads(value)
    except ValueError:
      out[key] = value
  return out


def params_file_only() -> bool:
  """True when the source is a bare params file without --model (convert needs no model)."""
  checkpoint = _CHECKPOINT.value or ''
  return checkpoint.endswith('.npz') and not (_MODEL.value or _BUNDLE.value or _WORKDIR.value)


def resolve():
  """The `Bundle` the flags name."""
  from vit_jax.checkpoint import bundle  # pylint: disable=g-import-not-at-top
  return bundle.resolve(workdir=_WORKDIR.value, checkpoint=_CHECKPOINT.value,
                        bundle=_BUNDLE.value, model=_MODEL.value,
                        options=parse_options(_MODEL_OPTIONS.value),
                        image_size=_IMAGE_SIZE.value, class_names=_CLASS_NAMES.value,
                        data_dir=_DATA_DIR.value)


def checkpoint_path():
  return _CHECKPOINT.value
