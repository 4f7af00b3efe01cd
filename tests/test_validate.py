"""The one validation of a training config (vit_jax/train/validate.py) and how the command line
spells the keys it names (vit_jax/cli.py: as_flags)."""

import subprocess
import sys

import pytest

from vit_jax.configs import common
from vit_jax.data import specs
from vit_jax import cli
from vit_jax.errors import UserError
from vit_jax.models import option_values
from vit_jax.train import validate
from helpers import ROOT


def _set(config, key, value):
  node = config
  *path, last = key.split('.')
  for part in path:
    node = node[part]
  node[last] = value


@pytest.mark.parametrize('key', [key for key, _ in validate.CHOICES])
def test_every_choice_key_refuses_an_unknown_value_naming_the_key_and_the_choices(key):
  config = common.base_config()
  _set(config, key, 'no_such_choice')
  valid = dict(validate.CHOICES)[key]()
  with pytest.raises(UserError) as e:
    validate.check_config(config)
  message = str(e.value)
  assert f"'no_such_choice': use config.{key}= one of " in message
  assert all(str(v) in message for v in valid) and len(valid) >= 2


@pytest.mark.parametrize('option', sorted(option_values.CHOICES))
def test_every_model_option_with_choices_is_checked_naming_the_key(option):
  """The config's model options go through the one check of model options
  (models/option_values.py) with the key as the config spells it."""
  config = common.base_config()
  config.model[option] = 'no_such_choice'
  with pytest.raises(UserError) as e:
    validate.check_config(config)
  assert str(e.value) == (f"unknown {option} 'no_such_choice': use config.model.{option}= one of "
                          f'{", ".join(option_values.CHOICES[option])}')


@pytest.mark.parametrize('key, value, message', [
    ('model.attention', 'flash', 'model.attention=flash has no attention dropout'),
    ('model.dtype', 'float31', "config.model.dtype='float31' is not a dtype"),
    ('model.stochastic_depth', 1.5, 'config.model.stochastic_depth=1.5 is out of range'),
    ('model_name', 'BiT-R14x0.5', "config.model.posemb='sincos2d' does not apply to BiT-R14x0.5"),
])
def test_model_options_are_checked_before_anything_is_built(key, value, message):
  config = common.base_config()
  config.model.attention_dropout_rate = 0.1 if key == 'model.attention' else 0.0
  config.model.posemb = 'sincos2d'
  _set(config, key, value)
  with pytest.raises(UserError, match=message):
    validate.check_config(config)


def test_the_validation_resolves_the_runs_task():
  config = common.base_config()
  config.loss = 'mpp'
  checked = validate.check_config(config)
  assert checked.task.is_mpp and checked.task.config is config
  assert checked.pp == specs.of_config(config)  # and its preprocessing, parsed
  # The task's own options are checked with the user's: masked patch prediction needs a ViT.
  config.model_name = 'BiT-R14x0.5'
  with pytest.raises(UserError, match='config.model.classifier=.unpooled. does not apply to BiT'):
    validate.check_config(config)


def test_choices_come_from_the_modules_that_use_them():
  from vit_jax import tasks  # pylint: disable=g-import-not-at-top
  from vit_jax.models import attention, vit  # pylint: disable=g-import-not-at-top
  choices = {key: tuple(fn()) for key, fn in validate.CHOICES}
  assert choices['loss'] == tasks.CHOICES == ('sigmoid_xent', 'softmax_xent', 'mpp')
  # The model's tables are the modules' own: remat policies and attention kernels.
  assert option_values.CHOICES['remat'] == ('none', 'full', 'dots', 'gelu')
  assert vit.REMAT_POLICIES is option_values.REMAT_POLICIES
  assert option_values.CHOICES['attention'] == attention.ATTENTIONS
  assert not [key for key in choices if key.startswith('model.')]  # one check of model options
  assert choices['optimizer'] == ('adam', 'sgd')
  from vit_jax.data import streams  # pylint: disable=g-import-not-at-top
  assert choices['data_sharding'] == streams.SHARDINGS == ('process', 'global')


@pytest.mark.parametrize('key, value, message', [
    ('pp.train', 'nope', r"^unknown preprocessing op 'nope' in config.pp.train: use "
                         r'one of central_crop, channels, flip, inception_crop, pad_crop, '),
    ('pp.eval', 'inception_crop', r'^config.pp.eval: inception_crop draws at random'),
    ('pp.train', 'pad_crop(pad=-2)', r'^config.pp.train: pad_crop\(pad=-2\): pad '),
    ('pp.train', 'randaug(num_layers=-1)', r'^config.pp.train: randaug\(num_layers=-1\): '
                                           r'num_layers=-1 must be an int >= 0'),
    ('pp.train', '', r'^config.pp.train is empty: name at least one op, e.g. resize$'),
    ('pp.train', 'inception_crop|flipp', r"^unknown preprocessing op 'flipp' in config.pp.train"),
    ('pp.eval', 'central_crop(resize=2)', r'^config.pp.eval: central_crop\(resize=2\): resize '),
    ('evals.knn.type', 'nope', r"^unknown evaluator type 'nope' in config.evals.knn.type"),
])
def test_registered_names_and_their_arguments_are_checked(key, value, message):
  """The preprocessing ops and evaluators a config names against their registries: one line
  naming the key, before anything is built."""
  config = common.base_config()
  _set(config, key, value)
  with pytest.raises(UserError, match=message):
    validate.check_config(config)


@pytest.mark.slow
def test_a_config_is_checked_before_tensorflow_is_imported():
  """A config mistake is reported in ~1 CPU-s, not after TensorFlow's ~3 (a fresh process: the
  test process has imported TensorFlow already), and so is one against the devices or the
  model's input size, a dataset that is unknown, not prepared or a folder that is none, or a file
  that is no image; a sweep reads logs without JAX or TensorFlow; vit_jax.data's names load when
  first used."""
  code = ('import sys\n'
          # A sweep reads its runs' logs without JAX or TensorFlow.
          'from vit_jax.tools import sweeps\n'
          'from vit_jax.run import guards, logs\n'
          'print(logs.read_metrics("/nonexistent/metrics.jsonl"), "jax" in sys.modules,\n'
          '      "tensorflow" in sys.modules)\n'
          'from vit_jax.configs import common\n'
          'from vit_jax.train import validate\n'
          'config = common.base_config()\n'
          'config.pp.train = "nope"\n'
          'try:\n'
          '  validate.check_config(config)\n'
          'except Exception as e:\n'
          '  print(type(e).__name__, "tensorflow" in sys.modules)\n'
          # The checks against the devices and the model's input size need no data either.
          'from vit_jax.train import program\n'
          'for key, value in (("image_size", 224), ("batch_size", 12), ("image_size", 30),\n'
          '                   ("accum_steps", 3)):\n'
          '  config = common.base_config()\n'
          '  config[key] = value\n'
          '  try:\n'
          '    program.check_placement(config)\n'
          '    print(key, "passes", end="; ")\n'
          '  except Exception as e:\n'
          '    print(key, type(e).__name__, str(e).split(":")[0], end="; ")\n'
          'print("tensorflow" in sys.modules)\n'
          # A dataset unknown to tfds, or not prepared in a local data_dir, is said without it.
          'from vit_jax.data import info\n'
          'for name in ("no_such_dataset", "cifar10", "imagenet2012", "folder:/nonexistent"):\n'
          '  try:\n'
          '    info.get_info(name, "/nonexistent/tfds")\n'
          '  except Exception as e:\n'
          '    print(name, type(e).__name__, str(e).split(":")[0], end="; ")\n'
          # Nor does a file that is no image, given to predict or the analyses.
          'from vit_jax.data import image_files, specs\n'
          'try:\n'
          '  spec = specs.eval_spec("resize", 8)\n'
          '  image_files.load_one("README.md", spec, 3)\n'
          'except Exception as e:\n'
          '  print(type(e).__name__, str(e).split(":")[0], end="; ")\n'
          'print("tensorflow" in sys.modules)\n'
          # Asking whether TensorFlow is installed (etils does for every local path) does not
          # import it; importing it does, through the quiet import.
          'import importlib.util, os\n'
          'from etils import epath\n'
          'from vit_jax.platform import tf_import\n'
          'tf_import.quiet_when_needed()\n'
          'found = importlib.util.find_spec("tensorflow") is not None\n'
          'print(found, epath.Path(os.getcwd()).is_dir(), "tensorflow" in sys.modules, end=" ")\n'
          'import tensorflow\n'
          'print(tensorflow.__name__)\n'
          # The data package's names and submodules still load on first use.
          'from vit_jax import data\n'
          'print(callable(data.train_iterator), callable(data.info.get_info),\n'
          '      data.SHARDINGS == data.choices.SHARDINGS, hasattr(data, "nope"))\n')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                        cwd=ROOT)
  assert 'oneDNN' not in proc.stderr, proc.stderr  # TensorFlow's banner: the import was quiet
  out = proc.stdout
  assert out.split('\n')[:6] == [
      '[] False False',
      'UserError False',
      'image_size passes; batch_size UserError batch_size=12 does not split over 8 devices in 1 '
      'processes; image_size UserError image size 30 is not divisible by the patch size 16 of '
      'this ViT (hidden 768, 12 layers); accum_steps UserError the per-device batch 512 does not '
      'split into accum_steps=3 micro-batches; False',
      "no_such_dataset UserError unknown dataset 'no_such_dataset' (did you mean math_dataset, "
      "bee_dataset, waymo_open_dataset?); cifar10 UserError dataset 'cifar10' is not prepared; "
      "imagenet2012 UserError dataset 'imagenet2012' is not prepared; folder:/nonexistent "
      "UserError folder; UserError cannot decode image README.md; False",
      'True True False tensorflow',
      'True True True False'], out


@pytest.mark.parametrize('key, value, must', [
    ('lr', -0.1, 'a number > 0'), ('batch_size', 0, 'an integer >= 1'),
    ('model.dropout_rate', 1.5, 'in [0, 1)'), ('warmup_steps', -1, 'a number >= 0')])
def test_ranges(key, value, must):
  config = common.base_config()
  _set(config, key, value)
  with pytest.raises(UserError) as e:
    validate.check_config(config)
  assert str(e.value) == f'config.{key}={value!r} is out of range: it must be {must}'


def test_defaults_pass_and_the_variant_and_classifier_are_checked():
  config = common.base_config()
  validate.check_config(config)  # the schema's defaults are valid
  config.model_name = 'ViT-Q/16'
  with pytest.raises(UserError, match="unknown model 'ViT-Q/16'"):
    validate.check_config(config)
  config = common.base_config()
  config.model.classifier = 'unpooled'
  with pytest.raises(UserError, match='trainer cannot score'):
    validate.check_config(config)


@pytest.mark.parametrize('message, shown', [
    ('config.lr=-0.1 is out of range', '--config.lr=-0.1 is out of range'),
    ('use config.model.remat=full or config.mesh.fsdp=-1',
     'use --config.model.remat=full or --config.mesh.fsdp=-1'),
    ('pass --config.batch_size=8', 'pass --config.batch_size=8'),   # already a flag
    ('see configs/default.py', 'see configs/default.py'),            # a path, not a key
    ('the run_config.lr of x', 'the run_config.lr of x'),            # part of another name
])
def test_the_command_line_spells_keys_as_flags(message, shown):
  assert cli.as_flags(message) == shown
