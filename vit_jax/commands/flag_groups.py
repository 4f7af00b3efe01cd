"""Flags used by more than one command, each defined once (absl flags are process-global).

A command asks for a flag with the function of its name (`_WORKDIR = flag_groups.workdir()`): the
first command that asks defines it, the others get the same flag, so every command module imports
into one process. Each flag is listed in the `--help` of every command that uses it. Where commands
differ (a default, what the flag means to them), the flag is defined with default None and the
command applies its own in its `main()` with `adapt` (e.g. `--batch_size`: predict 32, fewshot 256,
bench 8), before the flags are parsed, so its `--help` shows them.

The model source of predict, export and convert (`model_source()`):

  --workdir=DIR [--checkpoint=STEP|STEP_DIR]     a training run (newest step by default)
  --bundle=DIR                                   an exported inference bundle
  --checkpoint=FILE.npz|FILE.safetensors --model=NAME [--model_options=k=v,...]
                                                 a params file (a .safetensors written by this
                                                 project needs no --model)
  --checkpoint=ViT-B/16@imagenet21k+imagenet2012 official weights by name (downloaded once;
                                                 python -m vit_jax weights lists them)
  --image_size=S                                 run any of them at S x S pixels (the position
                                                 embedding resized as config.init does)
  --class_names=FILE                             one class name per line (overrides the source's)
"""

import dataclasses
import json
from typing import Any, Callable, Dict

from absl import flags
from ml_collections import config_flags

from vit_jax.errors import UserError

# A flag defined here belongs to the command that asks for it (a key flag: in its --help).
flags.disclaim_key_flags()

_DEFINED: Dict[str, Any] = {}
_KEEP = object()


def _shared(name: str, define: Callable[[], Any]):
  if name in _DEFINED:
    flags.declare_key_flag(name)  # a key flag of the calling command too
  else:
    _DEFINED[name] = define()
  return _DEFINED[name]


def adapt(name: str, *, default=_KEEP, help: str = None) -> None:  # pylint: disable=W0622
  """This command's default and help text of a shared flag; call before the flags are parsed."""
  if default is not _KEEP:
    flags.FLAGS.set_default(name, default)
  if help is not None:
    flags.FLAGS[name].help = help


# The groups. Help texts say what most commands mean; a command that means more says so (adapt).

def config():
  return _shared('config', lambda: config_flags.DEFINE_config_file(
      'config', None, 'Experiment config file[:args].', lock_config=True))


def workdir():
  return _shared('workdir', lambda: flags.DEFINE_string(
      'workdir', None, 'Training run directory (holds checkpoints/).'))


def checkpoint():
  return _shared('checkpoint', lambda: flags.DEFINE_string(
      'checkpoint', None, 'Step number or checkpoint step directory; default: newest.'))


def data_dir():
  return _shared('data_dir', lambda: flags.DEFINE_string(
      'data_dir', None, "tfds data_dir; default: the run's config."))


def dataset():
  return _shared('dataset', lambda: flags.DEFINE_string(
      'dataset', None, 'Dataset name (tfds, folder:PATH or embedded).'))


def batch_size():
  return _shared('batch_size', lambda: flags.DEFINE_integer(
      'batch_size', None, 'Images per forward pass.'))


def model():
  return _shared('model', lambda: flags.DEFINE_string(
      'model', None, 'Variant of a params file, e.g. ViT-B/16.'))


def patch_size():
  return _shared('patch_size', lambda: flags.DEFINE_integer(
      'patch_size', None, 'FlexiViT: the patch size to run the model at (the same params); '
      "default: the model's own."))


def image_size():
  return _shared('image_size', lambda: flags.DEFINE_integer(
      'image_size', None, 'Input size of a params file; default: from its position embedding.'))


def out():
  return _shared('out', lambda: flags.DEFINE_string('out', None, 'Where to write.'))


def json_output():
  return _shared('json', lambda: flags.DEFINE_bool('json', False, 'Print machine-readable JSON.'))


def dry_run():
  return _shared('dry_run', lambda: flags.DEFINE_bool(
      'dry_run', False, 'Print the commands instead of running them.'))


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """The flags that name a model to load (predict, export, convert)."""
  workdir: Any
  checkpoint: Any
  bundle: Any
  model: Any
  model_options: Any
  image_size: Any
  class_names: Any
  data_dir: Any
  patch_size: Any

  def params_file_only(self) -> bool:
    """True when the source is a bare params file without --model (convert needs no model)."""
    path = self.checkpoint.value or ''
    return path.endswith('.npz') and not (self.model.value or self.bundle.value or
                                          self.workdir.value)

  def check(self) -> None:
    """A bundle, run or params file that is not there, said before the heavy imports."""
    from vit_jax.serving import paths  # pylint: disable=g-import-not-at-top
    paths.check(workdir=self.workdir.value, checkpoint=self.checkpoint.value,
                bundle=self.bundle.value,
                params_options=bool(self.model.value or self.model_options.value))

  def resolve(self):
    """The `Bundle` the flags name."""
    from vit_jax.serving import bundle  # pylint: disable=g-import-not-at-top
    out = bundle.resolve(workdir=self.workdir.value, checkpoint=self.checkpoint.value,
                         bundle=self.bundle.value, model=self.model.value,
                         options=parse_options(self.model_options.value),
                         image_size=self.image_size.value, class_names=self.class_names.value,
                         data_dir=self.data_dir.value)
    if self.patch_size.value is not None:
      out = bundle.at_patch_size(out, self.patch_size.value)
    return out


def model_source() -> ModelSource:
  """The model-source group; the calling command's help says what --checkpoint can be."""
  return ModelSource(
      workdir=workdir(), checkpoint=checkpoint(),
      bundle=_shared('bundle', lambda: flags.DEFINE_string(
          'bundle', None, 'Inference bundle directory (python -m vit_jax export).')),
      model=model(),
      model_options=_shared('model_options', lambda: flags.DEFINE_string(
          'model_options', None, 'create_model options of a params file, e.g. classifier=gap,'
          'posemb=learned (by default inferred from the params).')),
      image_size=image_size(),
      class_names=_shared('class_names', lambda: flags.DEFINE_string(
          'class_names', None, 'Text file, one class name per line.')),
      data_dir=data_dir(), patch_size=patch_size())


MODEL_SOURCE_HELP = {
    'checkpoint': 'Step number or step directory of --workdir, a params file (.npz in any '
                  'official layout, or timm .safetensors), or official weights by name, e.g. '
                  'ViT-B/16@imagenet21k+imagenet2012 (python -m vit_jax weights lists them).',
    'data_dir': "tfds data_dir for the run's class names; default: the run's config.",
}


def adapt_model_source() -> None:
  """predict, export and convert: --checkpoint and --data_dir as the model source means them."""
  for name, text in MODEL_SOURCE_HELP.items():
    adapt(name, help=text)


def parse_options(text):
  """'k=v,k=v' -> dict; values are JSON when they parse (3, 0.1, true, null), else strings."""
  out_ = {}
  for item in filter(None, (text or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise UserError(f'--model_options item {item!r} is not key=value (e.g. classifier=gap)')
    try:
      out_[key] = json.loads(value)
    except ValueError:
      out_[key] = value
  return out_
