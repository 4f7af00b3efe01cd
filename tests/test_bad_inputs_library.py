"""The bad-input catalogue's cases that need no command line, each its own test: the
library raises one UserError line (the CLIs print it as `error: ...`, exit 2: test_bad_inputs.py
checks that path), nothing already written is lost, and odd inputs that can be used are used.

Disk full is simulated where it happens: TF's file writers raise ResourceExhaustedError
'<path>; No space left on device' (measured for metrics.jsonl and the TensorBoard event file on a
64 KiB tmpfs) and tfds' preparation an OSError(ENOSPC) (measured on an 8 KiB tmpfs); the
simulations raise exactly those, from the same calls.
"""

import errno
import io
import os
import re

import numpy as np
import pytest
from PIL import Image

from vit_jax.configs import mnist5k
from helpers import file_tree
from vit_jax import data as data_lib
from vit_jax.data import config_pp, folder, image_files, specs
from vit_jax.errors import UserError
from vit_jax.train import logs, loop, program


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
                                      f"{smallest}: use shots of at most {smallest} "):
    FewShotEvaluator(
        model=models.create_model('ViT-Ze/4', num_classes=10), mesh=mesh,
        param_shardings=sharding.replicated(mesh), dataset='mnist5k', data_dir=data_dir,
        train_split='train', eval_split='test', shots=(1, smallest + 1), l2_reg=1.0,
        batch_size=8 * jax.device_count(), cache=False,
        pp=config_pp.eval_pp(_config(data_dir)))


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
  assert info.tfds_info.features['label'].names == classes
  assert sum(info.split_sizes.values()) == images
  unreadable = re.findall(r'unreadable entry \((.*)\)', skipped)
  assert info.tfds_info.metadata.get('skipped_unreadable', []) == unreadable
  if make is _non_utf8_file:  # read under its real name, recorded under the shown one
    builder = data_lib.info.load_builder(f'folder:{root}', str(tmp_path / 'tfds'))
    records = builder.as_dataset(split='train+test').as_numpy_iterator()
    paths = [ex['path'].decode() for ex in records]
    assert 'cat/caf\\xe9.png' in paths


def test_disk_full_while_preparing_a_folder(tmp_path, monkeypatch):
  root = str(tmp_path / 'images')
  _two_classes(root)

  def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(folder.ImageFolder, 'download_and_prepare', full)
  with pytest.raises(UserError, match=r'^cannot prepare folder:.*/images in .*/tfds/image_folders/'
                                      r'images-[0-9a-f]{16} \(No space left on device\): free '
                                      r'space there or set config.data_dir to a disk with room'):
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
  real_init = logs.MetricLogger.__init__

  def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    if target == 'metrics.jsonl':
      self._jsonl = _FullDisk(self._jsonl, self.path, ok=3)  # steps 1-3 logged
    else:
      self._tb.file = _FullDisk(self._tb.file, self.tb_dir, ok=3)
  monkeypatch.setattr(logs.MetricLogger, '__init__', init)
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
  monkeypatch.setattr(logs.MetricLogger, '__init__', real_init)
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
  spec = specs.eval_spec({'crop': 'resize', 'image_size': 32})
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
  spec = specs.eval_spec({'crop': 'resize', 'image_size': 8})
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
