"""The bad-input catalogue's cases that need no command line, each its own test: the
library raises one UserError line (the CLIs print it as `error: ...`, exit 2: test_bad_inputs.py
checks that path), nothing already written is lost, and odd inputs that can be used are used.

Disk full is simulated where it happens: TF's file writers raise ResourceExhaustedError
'<path>; No space left on device' (measured for metrics.jsonl and the TensorBoard event file on a
64 KiB tmpfs) and tfds' preparation an OSError(ENOSPC) (measured on an 8 KiB tmpfs); the
simulations raise exactly those, from the same calls.
"""

import errno
import functools
import io
import os
import re

import numpy as np
import pytest
from PIL import Image

from vit_jax.configs import mnist5k
from helpers import ROOT, file_tree
from vit_jax import data as data_lib
from vit_jax.data import folder, image_files, specs
from vit_jax.data.archive import building
from vit_jax import errors
from vit_jax.errors import UserError
from vit_jax.train import loop, program
from vit_jax.run import logs


def _config(data_dir, **overrides):
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=6,batch_size=16')
  c.data_dir, c.warmup_steps, c.progress = data_dir, 1, False
  c.log_every, c.checkpoint_every, c.eval_every = 1, 2, 6
  for key, value in overrides.items():
    c[key] = value
  return c


def _workdir_with_notes(tmp_path):
  workdir = tmp_path / 'work'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('keep me')
  return workdir


# ---------------------------------------------------------------------------------------------
# No silent wrong result.


def test_num_classes_fewer_than_the_dataset_is_refused(data_dir):
  with pytest.raises(UserError, match=r'^config.num_classes=5 is fewer than the 10 classes of '
                                      r'mnist5k: labels 5..9 would have no output; leave '
                                      r'num_classes unset .* or set it >= 10$'):
    program.build_program(_config(data_dir, num_classes=5))


def test_num_classes_larger_than_the_dataset_is_allowed_and_said(data_dir, capfd):
  prog = program.build_program(_config(data_dir, num_classes=12))
  assert prog.num_classes == 12
  assert prog.abstract_state.params['head']['kernel'].shape[-1] == 12
  assert ('note: the head has num_classes=12 outputs for the 10 classes of mnist5k; outputs '
          '10..11 are never a target') in capfd.readouterr().err


@pytest.mark.slow
def test_fewshot_shots_above_the_class_size_are_refused(data_dir):
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax import models, parallel  # pylint: disable=g-import-not-at-top
  from vit_jax.data import catalog  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import FewShotEvaluator  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  _, labels = catalog.in_read_order('mnist5k', 'train')
  counts = np.bincount(labels)
  smallest = int(counts.min())
  name = str(int(np.argmin(counts)))  # mnist5k's class names are its labels
  mesh = parallel.make_mesh(ml_collections.ConfigDict({'data': -1}))
  with pytest.raises(UserError, match=f"^{smallest + 1}-shot needs {smallest + 1} images of every "
                                      f"class, but class '{name}' of 'mnist5k' split 'train' has "
                                      f"{smallest}: use shots of at most {smallest} "
                                      r"\(--config\.evals\.fewshot\.shots\)$"):
    FewShotEvaluator(
        model=models.create_model('ViT-Ze/4', num_classes=10), mesh=mesh,
        param_shardings=sharding.replicated(mesh), dataset='mnist5k', data_dir=data_dir,
        train_split='train', eval_split='test', shots=(1, smallest + 1), l2_reg=1.0,
        batch_size=8 * jax.device_count(), cache=False,
        spec=specs.of_config(_config(data_dir)).eval,
        setting=functools.partial(errors.evals_option, 'fewshot'))  # as the trainer builds it


# ---------------------------------------------------------------------------------------------
# Image folders with entries that cannot be read, or names that are not UTF-8.


def _png(path, value):
  Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _two_classes(root):
  for name in ('cat', 'dog'):
    os.makedirs(os.path.join(root, name))
    for i in range(3):
      _png(os.path.join(root, name, f'{i}.png'), 40 * i)


def _symlink_loop(root):
  os.symlink('..', os.path.join(root, 'cat', 'loop'))


def _dangling_symlink(root):
  os.symlink('/no/such/file.png', os.path.join(root, 'cat', 'gone.png'))


def _non_utf8_file(root):
  _png(os.fsencode(os.path.join(root, 'cat')) + b'/caf\xe9.png', 200)


def _non_utf8_class(root):
  os.makedirs(os.fsencode(root) + b'/\xe9t\xe9')
  for i in range(3):
    _png(os.fsencode(root) + b'/\xe9t\xe9/' + str(i).encode() + b'.png', 100 + i)


@pytest.mark.parametrize('make, classes, images, skipped', [
    (_symlink_loop, ['cat', 'dog'], 6, '; skipped 1 unreadable entry (cat/loop); '),
    (_dangling_symlink, ['cat', 'dog'], 6, '; skipped 1 unreadable entry (cat/gone.png); '),
    (_non_utf8_file, ['cat', 'dog'], 7, '; no file skipped; '),
    (_non_utf8_class, ['cat', 'dog', '\\xe9t\\xe9'], 9, '; no file skipped; '),
], ids=['symlink_loop', 'dangling_symlink', 'non_utf8_file_name', 'non_utf8_class_name'])
def test_image_folder_entries(tmp_path, capfd, make, classes, images, skipped):
  root = str(tmp_path / 'images')
  _two_classes(root)
  make(root)
  info = data_lib.get_info(f'folder:{root}', str(tmp_path / 'tfds'))
  err = capfd.readouterr().err
  assert f'prepared folder:{root}: {len(classes)} classes, {images} images' in err, err
  assert skipped in err, err
  assert list(info.class_names) == classes
  assert sum(info.split_sizes.values()) == images
  unreadable = re.findall(r'unreadable entry \((.*)\)', skipped)
  assert list(info.skipped.get('unreadable', [])) == unreadable
  if make is _non_utf8_file:  # read under its real name, named by the shown one
    index = info.release.splits['train'].index
    rows = [r for r in range(len(index)) if index.name(r) == 'cat/caf\\xe9.png']
    assert len(rows) == 1 and index.read(rows[0]) == open(
        os.fsencode(root) + b'/cat/caf\xe9.png', 'rb').read()


def test_disk_full_while_indexing_a_folder(tmp_path, monkeypatch):
  root = str(tmp_path / 'images')
  _two_classes(root)

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(building, 'write_json', full)
  with pytest.raises(UserError, match=r'^cannot write the index in .*/tfds/vit_jax_index/'
                                      r'images-[0-9a-f]{12}-[0-9a-f]{16} \(No space left on '
                                      r'device\): free space there or set \$VIT_JAX_INDEX_DIR'):
    data_lib.get_info(f'folder:{root}', str(tmp_path / 'tfds'))


# ---------------------------------------------------------------------------------------------
# The workdir: its layout, a read-only disk, a full disk while writing metrics.


@pytest.mark.parametrize('name, kind',
                         [('checkpoints', 'a directory'), ('metrics.jsonl', 'a file')], ids=['checkpoints_is_a_file', 'metrics_jsonl_is_a_directory'])
def test_workdir_entry_of_the_wrong_kind_is_refused_before_training(tmp_path, data_dir, name,
                                                                    kind):
  workdir = _workdir_with_notes(tmp_path)
  if kind == 'a directory':
    (workdir / name).write_text('not a directory')
  else:
    (workdir / name).mkdir()
  before = file_tree(workdir)
  with pytest.raises(UserError, match=f'^{workdir}/{name} is not {kind}, and the run writes its '
                                      f'{name} there: move it away or use another --workdir$'):
    loop.train_and_evaluate(_config(data_dir), str(workdir))
  assert file_tree(workdir) == before  # nothing written (the lock released)
  assert sorted(os.listdir(workdir)) == sorted(['notes.txt', name])


def test_read_only_workdir(tmp_path, data_dir, monkeypatch):
  workdir = _workdir_with_notes(tmp_path)
  real_open = open

  def read_only_open(path, mode='r', *args, **kwargs):
    if os.fspath(path).startswith(str(workdir)) and any(c in mode for c in 'wax+'):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
    return real_open(path, mode, *args, **kwargs)
  monkeypatch.setattr('builtins.open', read_only_open)
  with pytest.raises(UserError, match=f'^cannot write to --workdir={workdir} \\(Read-only file '
                                      'system\\): pass a writable directory$'):
    loop.train_and_evaluate(_config(data_dir), str(workdir))
  assert sorted(os.listdir(workdir)) == ['notes.txt']


class _FullDisk:
  """A metric file whose flushes fail after `ok` of them, as a local file's do on a full disk:
  OSError ENOSPC; what was not flushed is lost."""

  def __init__(self, inner, path, ok):
    self.inner, self.path, self.ok, self.pending = inner, path, ok, []

  def write(self, data):
    self.pending.append(data)

  def flush(self):
    if self.ok == 0:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
    self.ok -= 1
    for data in self.pending:
      self.inner.write(data)
    self.pending = []
    self.inner.flush()

  def close(self):
    self.inner.close()


@pytest.mark.parametrize('target', ['metrics.jsonl', 'tensorboard'],
                         ids=['metrics_jsonl', 'tensorboard'])
@pytest.mark.slow
def test_disk_full_while_writing_metrics(tmp_path, data_dir, monkeypatch, target):
  workdir = tmp_path / 'work'
  real_open = logs.MetricLogger._open  # the logger opens its files at its first record

  def opened(self):
    real_open(self)
    if target == 'metrics.jsonl':
      self._jsonl = _FullDisk(self._jsonl, self.path, ok=3)  # steps 1-3 logged
    else:
      self._tb.file = _FullDisk(self._tb.file, self.tb_dir, ok=3)
  monkeypatch.setattr(logs.MetricLogger, '_open', opened)
  with pytest.raises(UserError) as error:
    loop.train_and_evaluate(_config(data_dir), str(workdir))
  where = workdir / target
  match = re.fullmatch(f'cannot write the metrics to {where} \\(No space left on device\\): free '
                       f'space or fix permissions there; the checkpoint of step (\\d+) in '
                       f'{workdir}/checkpoints stands: rerun the same command to resume from it',
                       str(error.value))
  assert match, str(error.value)
  # Step 4's record failed, and a checkpoint is saved only after its steps are logged.
  assert int(match.group(1)) == 2 and os.listdir(workdir / 'checkpoints') == ['2']
  logged = [r['step'] for r in logs.read_metrics(str(workdir / 'metrics.jsonl'))]
  # What was written before stays (the TensorBoard case wrote step 4's JSONL line first).
  assert logged == ([1, 2, 3] if target == 'metrics.jsonl' else [1, 2, 3, 4])
  assert not os.path.exists(workdir / 'run.lock')
  # With space again, the same command resumes there and logs every step once.
  monkeypatch.setattr(logs.MetricLogger, '_open', real_open)
  loop.train_and_evaluate(_config(data_dir), str(workdir))
  records = logs.read_metrics(str(workdir / 'metrics.jsonl'))
  assert [r['step'] for r in records if r['split'] == 'train'] == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------------------------------------
# Commands that only read.


def test_analyze_out_is_an_existing_file(tmp_path):
  from vit_jax.analysis import report  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'figures.txt'
  out.write_text('keep me')
  with pytest.raises(UserError, match=f'^--out={out} is a file, and the figures go into a '
                                      'directory: pass a new or existing directory$'):
    report.write_report(workdir=str(tmp_path / 'no_run'), out=str(out))
  assert out.read_text() == 'keep me'


def test_cmyk_jpeg_decodes_for_a_one_channel_model(tmp_path):
  rng = np.random.default_rng(0)
  rgb = np.clip(rng.normal(128, 60, (8, 8, 3)).repeat(4, 0).repeat(4, 1), 0, 255).astype(np.uint8)
  cmyk = io.BytesIO()
  Image.fromarray(rgb).convert('CMYK').save(cmyk, 'JPEG', quality=95)
  (tmp_path / 'cmyk.jpg').write_bytes(cmyk.getvalue())
  # The reference: the same JPEG decoded to RGB by Pillow, stored losslessly.
  Image.open(io.BytesIO(cmyk.getvalue())).convert('RGB').save(tmp_path / 'reference.png')
  spec = specs.eval_spec('resize', 32)
  gray = image_files.load_one(str(tmp_path / 'cmyk.jpg'), spec, 1)
  expected = image_files.load_one(str(tmp_path / 'reference.png'), spec, 1)
  assert gray.shape == (32, 32, 1)
  # TF decodes JPEGs with libjpeg's fast integer IDCT, Pillow with the accurate one: measured
  # 1.6 levels apart on average, 7 at most (of 255); a wrong colour conversion is far off.
  levels = np.abs(gray - expected) * 127.5
  assert levels.mean() < 2.5 and levels.max() < 10, (levels.mean(), levels.max())
  assert np.corrcoef(gray.ravel(), expected.ravel())[0, 1] > 0.998
  assert np.std(gray) > 0.2  # an image, not a constant


def test_every_format_tf_decodes_passes_the_first_bytes_check_and_others_do_not(tmp_path):
  """image_files refuses a file by its first bytes before importing TensorFlow: the four formats
  tf.io.decode_image reads still load (same pixels as Pillow's, lossless ones), anything else is
  the one-line decode error, an empty file too."""
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
  spec = specs.eval_spec('resize', 8)
  for fmt in ('PNG', 'JPEG', 'GIF', 'BMP'):
    path = tmp_path / f'image.{fmt.lower()}'
    Image.fromarray(rgb).save(path, fmt)
    got = image_files.load_one(str(path), spec, 3)
    if fmt != 'JPEG':  # lossless: the stored pixels, as (x - 127.5) / 127.5
      with Image.open(path) as image:
        stored = np.asarray(image.convert('RGB'), np.float32)
      np.testing.assert_allclose(got, (stored - 127.5) / 127.5, atol=1e-6, err_msg=fmt)
    assert got.shape == (8, 8, 3), fmt
  for name, content in [('notes.png', b'hello'), ('empty.jpg', b''), ('page.jpg', b'<html>')]:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=f'^cannot decode image {tmp_path / name}: not a readable '
                                        'PNG or JPEG file$'):
      image_files.load_one(str(tmp_path / name), spec, 3)


# ---------------------------------------------------------------------------------------------
# `none` is a value; only `None` unsets a key (vit_jax/cli.py, vit_jax/configs/common.py).


def _parsed_overrides(monkeypatch, *overrides):
  """The config the command line `--config=configs/default.py *overrides` gives (flags parsed
  as the commands parse them, into flag values of their own)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from vit_jax import cli  # pylint: disable=g-import-not-at-top
  argv = ['vit_jax.main', '--config=configs/default.py', *overrides]
  fresh = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'config', lock_config=True, flag_values=fresh)
  monkeypatch.setattr(flags, 'FLAGS', fresh)
  monkeypatch.setattr('sys.argv', argv)  # ml_collections finds the overrides to define there
  monkeypatch.chdir(ROOT)
  cli._parse_flags(argv)  # pylint: disable=protected-access
  return fresh.config


def _keys_with_the_value_none():
  from vit_jax.models import option_values  # pylint: disable=g-import-not-at-top
  from vit_jax.train import validate  # pylint: disable=g-import-not-at-top
  return ([key for key, choices in validate.CHOICES if 'none' in choices()] +
          [f'model.{key}' for key, choices in option_values.CHOICES.items() if 'none' in choices])


def test_the_keys_with_the_value_none_are_found():
  assert {'model.remat', 'model.posemb'} <= set(_keys_with_the_value_none())


@pytest.mark.parametrize('key', _keys_with_the_value_none())
def test_none_is_a_value_of_the_keys_that_have_it(monkeypatch, key):
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.train import validate  # pylint: disable=g-import-not-at-top
  config = _parsed_overrides(monkeypatch, f'--config.{key}=none')
  assert common.get_value(config, key) == 'none'
  validate.check_choices(config)  # a valid value


@pytest.mark.parametrize('key', _keys_with_the_value_none())
def test_None_cannot_unset_the_keys_that_have_the_value_none(monkeypatch, capsys, key):
  with pytest.raises(SystemExit) as stop:
    _parsed_overrides(monkeypatch, f'--config.{key}=None')
  assert stop.value.code == 2
  assert capsys.readouterr().err == (
      f'error: --config.{key}=None: {key} always has a value (only the keys whose default is None '
      'can be unset): give it a value, see configs/README.md\n')


def test_None_unsets_a_key_whose_default_is_None(monkeypatch):
  config = _parsed_overrides(monkeypatch, '--config.total_steps=None', '--config.total_epochs=2')
  assert config.total_steps is None and config.total_epochs == 2.0


@pytest.mark.parametrize('spelling', ['none', 'null'])
def test_other_spellings_of_unset_are_values_with_a_hint(monkeypatch, capsys, spelling):
  with pytest.raises(SystemExit):
    _parsed_overrides(monkeypatch, f'--config.total_steps={spelling}')
  err = capsys.readouterr().err
  assert err.startswith(f'error: flag --config.total_steps={spelling}: ') and err.endswith(
      '(to unset total_steps, spell it --config.total_steps=None)\n') and err.count('\n') == 1
  config = _parsed_overrides(monkeypatch, f'--config.data_dir={spelling}')
  assert config.data_dir == spelling  # a string key takes the text as it is


def test_a_config_argument_none_is_that_value_and_None_unsets():
  from vit_jax.configs import common, pretrain  # pylint: disable=g-import-not-at-top
  plain = pretrain.get_config('model=S/16,dataset=imagenet21k,augreg=true,aug=none')
  recommended = pretrain.get_config('model=S/16,dataset=imagenet21k,augreg=true')
  assert ('randaug' in plain.pp.train, plain.mixup) == (False, 0.0)  # the level `none`
  assert 'randaug(num_layers=2, magnitude=0)' in recommended.pp.train  # S/16's: light1
  assert common.parse_arg('x=none', x=None) == {'x': 'none'}
  assert common.parse_arg('x=None', x='a') == {'x': 'None'}
  assert common.parse_arg('x=None', x=None) == {'x': None}


def test_a_dependency_that_is_not_installed_is_one_line_and_a_bug_keeps_its_traceback():
  """A missing third-party module (TensorFlow on a machine with only JAX, say) is a fault of the
  machine: one line naming the module and how to install it. A module of the project that fails
  to import is a bug (None: its traceback stays)."""
  from vit_jax import errors  # pylint: disable=g-import-not-at-top
  missing = ModuleNotFoundError("No module named 'tensorflow.python'", name='tensorflow.python')
  assert errors.environment_failure(missing) == (
      "this command needs the Python module 'tensorflow', which is not installed: install the "
      "project's dependencies (make install, or pip install -r requirements.lock), then rerun the "
      "same command")
  assert errors.environment_failure(ModuleNotFoundError('x', name='vit_jax.nonexistent')) is None
  # Only the error itself: a bug raised while handling an import error keeps its traceback.
  try:
    try:
      raise ModuleNotFoundError('x', name='tensorflow')
    except ModuleNotFoundError:
      raise KeyError('a bug')  # pylint: disable=raise-missing-from
  except KeyError as e:
    assert errors.environment_failure(e) is None
