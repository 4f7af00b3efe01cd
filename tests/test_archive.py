"""ImageNet-21k and ImageNet-1k read in place from their releases (vit_jax/data/releases.py,
vit_jax/data/archive/), on fake releases the tests write: a tar of per-synset tars of small JPEGs
with one corrupt member and one non-image, and an ILSVRC2012 layout (train tar of tars, validation
tar, devkit)."""

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import warnings
import zipfile

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import scipy.io
import tensorflow_datasets as tfds
from PIL import Image

from vit_jax.configs import pretrain
from helpers import ROOT, cut_run, train_losses
from vit_jax import data as data_lib
from vit_jax.data import archive, releases, specs
from vit_jax.data.sources import imagenet
from vit_jax.errors import UserError
from vit_jax.train import loop

SYNSETS = ('n00000004', 'n00000001', 'n00000003', 'n00000002')  # archive order: not sorted
PER_CLASS = 12
CORRUPT = 'n00000001/n00000001_corrupt.JPEG'
PP = specs.train_spec('inception_crop|flip', 16)
# The tiny model the recipe commands train here: the recipe's own settings otherwise.
TINY = ('--config.model_name=ViT-Ze/4', '--config.model.representation_size=8',
        '--config.image_size=16', '--config.batch_size=8', '--config.eval_batch_size=8',
        '--config.total_epochs=0.7', '--config.warmup_steps=1', '--config.progress=false')


def jpeg(seed: int, size=(20, 16)) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, 'JPEG', quality=70)
  return out.getvalue()


def tar_bytes(files) -> bytes:
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode='w') as tar:
    for name, data in files:
      member = tarfile.TarInfo(name)
      member.size, member.mtime = len(data), 0
      tar.addfile(member, io.BytesIO(data))
  return out.getvalue()


def zip_bytes(files) -> bytes:
  """A zip of (name, data, method) members (method (ZIP_DEFLATED, 0): deflated at level 0, in
  stored blocks); a name ending in '+' (dropped) gets a local header whose extra field the
  central directory does not have (a zip64 one), as zip tools write."""
  out = io.BytesIO()
  with zipfile.ZipFile(out, 'w') as z, warnings.catch_warnings():
    warnings.simplefilter('ignore')  # a name written twice, on purpose
    for name, data, method in files:
      info = zipfile.ZipInfo(name.rstrip('+'), (2020, 1, 1, 0, 0, 0))
      info.compress_type, level = method if isinstance(method, tuple) else (method, None)
      if name.endswith('+'):
        with z.open(info, 'w', force_zip64=True) as member:
          member.write(data)
      else:
        z.writestr(info, data, compresslevel=level)
  return out.getvalue()


def zip_data_range(blob: bytes, name: str):
  """(offset, size) of member `name`'s stored data in zip `blob`, from its local header."""
  with zipfile.ZipFile(io.BytesIO(blob)) as z:
    info = z.getinfo(name)
  lengths = np.frombuffer(blob[info.header_offset + 26:info.header_offset + 30], '<u2')
  return info.header_offset + 30 + int(lengths.sum()), info.compress_size


def class_tars(synsets, per_class, extras=True):
  """{synset: tar bytes}, and {image name: bytes} of the images (corrupt one included)."""
  tars, images = {}, {}
  for c, synset in enumerate(synsets):
    files = [(f'{synset}_{i}.JPEG', jpeg(1000 * c + i)) for i in range(per_class)]
    if extras and synset == 'n00000001':
      files.append((f'{synset}_corrupt.JPEG', b'\xff\xd8\xff' + b'not a jpeg ' * 20))
    images.update({f'{synset}/{name}': data for name, data in files})
    if extras and synset == 'n00000003':
      files.append(('readme.txt', b'not an image'))
    tars[synset] = tar_bytes(files)
  return tars, images


def write_i21k(data_dir) -> dict:
  tars, images = class_tars(SYNSETS, PER_CLASS)
  os.makedirs(os.path.join(data_dir, 'imagenet21k'))
  with open(os.path.join(data_dir, 'imagenet21k', 'fall11_whole.tar'), 'wb') as f:
    f.write(tar_bytes([(f'{s}.tar', tars[s]) for s in SYNSETS]))
  return images


@pytest.fixture(scope='module')
def i21k(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('i21k'))
  return data_dir, write_i21k(data_dir)


@pytest.fixture(scope='module')
def i1k(tmp_path_factory):
  """A fake ILSVRC2012 release: 3 synsets of 8 training images, 6 validation images, and the
  devkit, whose ILSVRC ids order the synsets otherwise than sorting does."""
  data_dir = str(tmp_path_factory.mktemp('i1k'))
  root = os.path.join(data_dir, 'imagenet2012')
  os.makedirs(root)
  synsets = ('n00000003', 'n00000001', 'n00000002')
  tars, _ = class_tars(synsets, 8, extras=False)
  with open(os.path.join(root, releases.I1K_TRAIN), 'wb') as f:
    f.write(tar_bytes([(f'{s}.tar', tars[s]) for s in synsets]))
  val = {f'ILSVRC2012_val_{i:08d}.JPEG': jpeg(90 + i) for i in range(1, 7)}
  with open(os.path.join(root, releases.I1K_VAL), 'wb') as f:
    f.write(tar_bytes(sorted(val.items(), reverse=True)))  # stored in another order
  ids = [2, 3, 1, 1, 2, 3]  # ILSVRC ids of images 1..6; id i is synsets[i - 1]
  write_devkit(root, ''.join(f'{i}\n' for i in ids).encode(), meta_mat(synsets))
  labels = [sorted(synsets).index(synsets[i - 1]) for i in ids]
  return data_dir, labels


def meta_mat(synsets) -> bytes:
  """The devkit's meta.mat: ILSVRC id i + 1 is synsets[i]."""
  meta = io.BytesIO()
  scipy.io.savemat(meta, {'synsets': np.array(
      [(i + 1, s, 0) for i, s in enumerate(synsets)],
      dtype=[('ILSVRC2012_ID', 'O'), ('WNID', 'O'), ('num_children', 'O')])})
  return meta.getvalue()


def write_devkit(root, ground_truth: bytes, meta: bytes) -> None:
  devkit = io.BytesIO()
  with tarfile.open(fileobj=devkit, mode='w:gz') as tar:
    for name, data in ((releases.I1K_GROUND_TRUTH, ground_truth), ('meta.mat', meta)):
      member = tarfile.TarInfo(f'{releases.I1K_DEVKIT}/data/{name}')
      member.size = len(data)
      tar.addfile(member, io.BytesIO(data))
  with open(os.path.join(root, f'{releases.I1K_DEVKIT}.tar.gz'), 'wb') as f:
    f.write(devkit.getvalue())


# ---------------------------------------------------------------------------------------------
# The index.


def test_the_index_addresses_every_member_in_place(i21k):
  data_dir, images = i21k
  ds_info = data_lib.get_info('imagenet21k', data_dir)
  assert ds_info.num_classes == 4 and ds_info.class_names == tuple(sorted(SYNSETS))
  assert ds_info.split_sizes == {'full': len(images)} == {'full': 4 * PER_CLASS + 1}
  assert ds_info.num_examples('full[10:]') == len(images) - 10
  split = ds_info.release.splits['full']
  index = split.index
  assert index.skipped_non_images == 1  # readme.txt
  assert index.layout == 'tar_of_tars' and index.files == ('',)
  # Each row reads its member's bytes from the outer tar (outer + inner offset), unchanged.
  names = [index.name(r) for r in range(len(index))]
  assert sorted(names) == sorted(images)
  for row, name in enumerate(names):
    assert index.read(row) == images[name], name
  # 'full' is the SHA-256 order of the names; labels are the sorted synsets' places.
  by_hash = sorted(names, key=lambda n: hashlib.sha256(n.encode()).digest())
  assert [names[r] for r in split.rows] == by_hash
  assert [ds_info.class_names[l] for l in split.labels] == [n.split('/')[0] for n in by_hash]


@pytest.mark.parametrize('layout', ['tars', 'folders'])
def test_the_release_unpacked_gives_the_same_images(layout, i21k, tmp_path):
  """The per-synset tars or synset folders the whole archive unpacks into: the same split."""
  data_dir, images = i21k
  root = tmp_path / 'imagenet21k'
  root.mkdir()
  tars, _ = class_tars(SYNSETS, PER_CLASS)
  for synset, data in tars.items():
    if layout == 'tars':
      (root / f'{synset}.tar').write_bytes(data)
    else:
      with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(root / synset, filter='data')
  unpacked = releases.find('imagenet21k', str(tmp_path)).splits['full']
  whole = imagenet.load('imagenet21k', data_dir).release.splits['full']
  assert unpacked.index.layout == layout and unpacked.index.skipped_non_images == 1
  names = [unpacked.index.name(r) for r in unpacked.rows]
  assert names == [whole.index.name(r) for r in whole.rows]
  assert [unpacked.index.read(r) for r in unpacked.rows] == [images[n] for n in names]
  np.testing.assert_array_equal(unpacked.labels, whole.labels)


_KILLED_BUILD = """
import sys, time
from vit_jax.data import archive
archive.build(sys.argv[1], 'tars', sys.argv[2], workers=1,
                    on_part=lambda k: time.sleep(0.25))
"""


def _tar_folder(tmp_path, classes: int, per_class: int):
  """A folder of `classes` per-synset tars (no extras) under tmp_path/tars, and its images."""
  root = tmp_path / 'tars'
  root.mkdir()
  tars, images = class_tars([f'n{i:08d}' for i in range(classes)], per_class, extras=False)
  for synset, data in tars.items():
    (root / f'{synset}.tar').write_bytes(data)
  return root, images


@pytest.mark.slow
def test_indexing_resumes_after_a_kill_and_does_only_the_missing_parts(tmp_path):
  root, images = _tar_folder(tmp_path, 12, 2)
  base = str(tmp_path / 'index')
  directory = archive.index_dir(str(root), 'tars', base)
  proc = subprocess.Popen([sys.executable, '-c', _KILLED_BUILD, str(root), base], cwd=ROOT,
                          env={**os.environ, 'PYTHONPATH': ROOT}, stderr=subprocess.PIPE)
  parts = os.path.join(directory, 'parts')
  deadline = time.monotonic() + 60
  while not (os.path.isdir(parts) and len(os.listdir(parts)) >= 3):
    assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  proc.stderr.close()
  done_before = {int(n[:7]) for n in os.listdir(parts) if '.tmp' not in n}
  assert 3 <= len(done_before) < 12
  assert not os.path.exists(os.path.join(directory, 'done.json'))

  built = []
  index = archive.load(str(root), 'tars', base, workers=2, on_part=built.append)
  assert sorted(built) == sorted(set(range(12)) - done_before)  # only the missing parts
  assert sorted(index.name(r) for r in range(len(index))) == sorted(images)
  assert all(index.read(r) == images[index.name(r)] for r in range(len(index)))
  fresh = archive.load(str(root), 'tars', str(tmp_path / 'fresh'), workers=1)
  for key in ('unit', 'file', 'offset', 'size', 'names', 'name_ends', 'hash_order'):
    np.testing.assert_array_equal(getattr(index, key), getattr(fresh, key))


def test_hosts_sharing_a_directory_split_the_units(tmp_path):
  root, _ = _tar_folder(tmp_path, 5, 1)
  base = str(tmp_path / 'index')
  second = []
  with pytest.raises(UserError, match='still misses parts of other hosts'):
    archive.build(str(root), 'tars', base, shard=(1, 2), workers=1, wait_s=0,
                        on_part=second.append)
  first = []
  archive.build(str(root), 'tars', base, shard=(0, 2), workers=1, on_part=first.append)
  assert (sorted(first), sorted(second)) == ([0, 2, 4], [1, 3])
  assert len(archive.load(str(root), 'tars', base, shard=(1, 2))) == 5


# ---------------------------------------------------------------------------------------------
# The streams.


def _batches(data_dir, n, **kwargs):
  it = data_lib.train_iterator(dataset='imagenet21k', split='full', data_dir=data_dir,
                               batch_size=8, spec=PP, seed=3, **kwargs)
  return [next(it) for _ in range(n)]


def test_a_stream_let_go_of_stops_its_reads_and_is_kept_from_a_teardown_in_flight(
    i21k, monkeypatch):
  """A release stream closed before its end (a finished run, a dropped iterator) is not torn
  down with reads in flight (TensorFlow's teardown can then wait forever): its reads fail at
  once from then on and the pipeline is kept until the process ends."""
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  readers, reads = [], []
  original_read = releases.read

  class Reader(pipeline._Reader):  # pylint: disable=protected-access
    def __init__(self, release):
      super().__init__(release)
      readers.append(self)

  monkeypatch.setattr(pipeline, '_Reader', Reader)
  monkeypatch.setattr(releases, 'read', lambda *a: reads.append(1) or original_read(*a))
  monkeypatch.setattr(pipeline, '_LET_GO', [])
  it = data_lib.train_iterator(dataset='imagenet21k', split='full', data_dir=i21k[0],
                               batch_size=8, spec=PP, seed=3)
  assert next(it)['image'].shape == (8, 16, 16, 3)
  (reader,) = readers
  assert not reader.let_go and not pipeline._LET_GO  # pylint: disable=protected-access
  it.close()
  assert reader.let_go and len(pipeline._LET_GO) == 1  # pylint: disable=protected-access
  before = len(reads)
  encoded, ok = reader._read(np.arange(8, dtype=np.int64))  # pylint: disable=protected-access
  assert not ok and list(encoded) == [b''] * 8 and len(reads) == before  # nothing read


@pytest.mark.slow
def test_the_train_stream_resumes_exactly_and_skips_the_corrupt_image(i21k, capfd):
  data_dir, images = i21k
  capfd.readouterr()
  full = _batches(data_dir, 13, shuffle_buffer=1000)  # 104 positions: two epochs of 49
  err = capfd.readouterr().err
  # Met once an epoch, named once a run, counted when the stream ends.
  assert err.count(f'skipped an image of imagenet21k that does not decode: {CORRUPT} (') == 1, err
  assert (f'warning: 1 image of imagenet21k did not decode and was skipped 2 times in this run: '
          f'{CORRUPT}\n') in err, err
  for batch in full:
    assert batch['image'].shape == (8, 16, 16, 3) and batch['label'].shape == (8,)
    assert set(batch) == {'image', 'label'}
  resumed = _batches(data_dir, 6, shuffle_buffer=1000, start_step=7)
  for a, b in zip(full[7:], resumed, strict=True):
    np.testing.assert_array_equal(a['image'], b['image'])
    np.testing.assert_array_equal(a['label'], b['label'])


@pytest.mark.slow
def test_the_stream_holds_each_member_decoded_and_preprocessed(i21k):
  """Without shuffling, a release's train stream is 'full' in its stored order, each image its
  member's bytes through the same decode and preprocessing as a tfds record's."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  data_dir, images = i21k
  spec = specs.train_spec('resize', 16)
  it = data_lib.train_iterator(dataset='imagenet21k', split='full[8:16]', data_dir=data_dir,
                               batch_size=8, spec=spec, seed=0, shuffle_buffer=1)
  batch = next(it)
  split = imagenet.load('imagenet21k', data_dir).release.splits['full']
  for i, row in enumerate(split.rows[8:16]):
    name = split.index.name(row)
    assert name != CORRUPT  # (the fixed hash order puts it in full[:8])
    image = preprocess.decode(tf.constant(images[name]), 3)
    np.testing.assert_array_equal(
        batch['image'][i], preprocess.train_preprocess(image, tf.constant([0, 0], tf.int64),
                                                       spec).numpy())
    assert batch['label'][i] == sorted(SYNSETS).index(name.split('/')[0])


@pytest.mark.slow
def test_two_processes_read_disjoint_shards_that_cover_the_split(i21k):
  data_dir, images = i21k
  release = imagenet.load('imagenet21k', data_dir).release
  split = 'full[9:]'
  shares = [releases.records(release, s)[0] for s in tfds.even_splits(split, n=2)]
  assert not set(shares[0]) & set(shares[1])
  assert sorted(np.concatenate(shares)) == sorted(releases.records(release, split)[0])
  assert [len(s) for s in shares] == [20, 20]
  # The eval batches: each image once over both processes, the corrupt one masked out.
  seen = []
  for index in range(2):
    batches, n = data_lib.eval_iterator(dataset='imagenet21k', split='full', data_dir=data_dir,
                                        batch_size=8, spec=specs.eval_spec('central_crop(resize=18)', 16),
                                        process_index=index, process_count=2)
    masks = [b['mask'] for b in batches]
    assert n == len(masks) == 4
    seen.append(sum(float(m.sum()) for m in masks))
  assert sum(seen) == len(images) - 1


def _recipe(dataset: str, steps: int):
  c = pretrain.get_config(f'model=B/16,dataset={dataset}')
  c.model_name, c.image_size, c.batch_size, c.eval_batch_size = 'ViT-Ze/4', 16, 8, 8
  c.model.representation_size = 8
  c.total_epochs, c.total_steps, c.warmup_steps = None, steps, 2
  c.train_split, c.eval_split = 'full[8:]', 'full[:8]'
  c.checkpoint_every, c.eval_every, c.log_every, c.progress = 10, 20, 5, False
  return c


@pytest.mark.slow
def test_the_recipe_trains_20_steps_and_resumes_exactly_after_a_kill(i21k, tmp_path):
  data_dir, _ = i21k
  c = _recipe('imagenet21k', 20)
  c.data_dir = data_dir
  full = str(tmp_path / 'full')
  result = loop.train_and_evaluate(c, full)
  assert result['count'] == 7  # full[:8] less the corrupt image
  # The run killed after its step-10 checkpoint: the rest of its workdir gone, then rerun.
  cut = str(tmp_path / 'cut')
  cut_run(full, cut, keep_step=10, drop_step=20)
  assert loop.train_and_evaluate(c, cut) == result
  assert train_losses(cut) == train_losses(full) and len(train_losses(full)) == 4
  with ocp.StandardCheckpointer() as ckptr:
    a, b = (ckptr.restore(os.path.join(w, 'checkpoints', '20', 'state'))['params']
            for w in (full, cut))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _main(*args):
  return subprocess.run([sys.executable, '-m', 'vit_jax.main', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize('dataset', ['imagenet21k', 'imagenet2012'])
def test_the_recipe_commands_start_training_on_the_release(dataset, i21k, i1k, tmp_path):
  """docs/recipes.md's pre-training commands, with the tiny model's overrides."""
  data_dir = (i21k if dataset == 'imagenet21k' else i1k)[0]
  # The fake ImageNet-21k has 49 images: it holds out 8, not 51,200.
  splits = (('--config.train_split=full[8:]', '--config.eval_split=full[:8]')
            if dataset == 'imagenet21k' else ())
  proc = _main(f'--config=configs/pretrain.py:model=B/16,dataset={dataset}',
               f'--workdir={tmp_path}/run', f'--config.data_dir={data_dir}', *TINY, *splits)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'training on {dataset}' in proc.stderr and 'trained steps 1-' in proc.stderr, proc.stderr
  assert set(os.listdir(data_dir)) == {dataset, 'vit_jax_index'}  # no copy, only the index


@pytest.mark.slow
def test_imagenet2012_from_the_official_archives(i1k):
  data_dir, val_labels = i1k
  ds_info = data_lib.get_info('imagenet2012', data_dir)
  assert ds_info.class_names == ('n00000001', 'n00000002', 'n00000003')
  assert ds_info.split_sizes == {'train': 24, 'validation': 6}
  release = ds_info.release
  val = release.splits['validation']
  assert [val.index.name(r) for r in val.rows] == [f'ILSVRC2012_val_{i:08d}.JPEG'
                                                   for i in range(1, 7)]  # file-name order
  assert val.labels.tolist() == val_labels  # the devkit's ILSVRC ids -> synsets -> labels
  train = release.splits['train']
  assert [ds_info.class_names[l] for l in train.labels] == [
      train.index.name(r).split('/')[0] for r in train.rows]
  # The same labels from the ordered synset list instead of the devkit.
  other = os.path.join(os.path.dirname(data_dir), 'i1k_list')
  shutil.copytree(data_dir, other, ignore=shutil.ignore_patterns('vit_jax_index', '*.tar.gz'))
  with open(os.path.join(other, 'imagenet2012', releases.I1K_LABEL_LIST), 'w') as f:
    f.write(''.join(f'{ds_info.class_names[l]}\n' for l in val_labels))
  listed = releases.find('imagenet2012', other).splits['validation']
  assert listed.labels.tolist() == val_labels


# ---------------------------------------------------------------------------------------------
# Bad releases: one `error:` line.


def _error_line(data_dir, tmp_path, dataset='imagenet21k') -> str:
  proc = _main(f'--config=configs/pretrain.py:model=B/16,dataset={dataset}',
               f'--workdir={tmp_path}/run', f'--config.data_dir={data_dir}', *TINY)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  return lines[0]


@pytest.mark.slow
def test_a_missing_archive_an_unknown_layout_and_a_truncated_tar_are_one_line(tmp_path):
  assert 'no ImageNet-21k release under' in _error_line(tmp_path / 'none', tmp_path)
  layout = tmp_path / 'layout'
  (layout / 'imagenet21k').mkdir(parents=True)
  (layout / 'imagenet21k' / 'notes.txt').write_text('x')
  assert 'unknown layout in' in _error_line(layout, tmp_path)
  cut = tmp_path / 'cut'
  write_i21k(str(cut))
  whole_tar = cut / 'imagenet21k' / 'fall11_whole.tar'
  data = whole_tar.read_bytes()
  whole_tar.write_bytes(data[:len(data) * 2 // 3])
  assert 'is truncated' in _error_line(cut, tmp_path)


@pytest.mark.slow
def test_the_index_of_a_changed_archive_is_refused(tmp_path):
  data_dir = tmp_path / 'changed'
  write_i21k(str(data_dir))
  data_lib.get_info('imagenet21k', str(data_dir))  # indexed
  whole_tar = data_dir / 'imagenet21k' / 'fall11_whole.tar'
  tars, _ = class_tars(SYNSETS[:3], 5)
  whole_tar.write_bytes(tar_bytes([(f'{s}.tar', tars[s]) for s in SYNSETS[:3]]))
  line = _error_line(data_dir, tmp_path)
  assert 'was built from other contents of' in line and 'delete that directory' in line


class _AlwaysFirstClass:
  """Predicts class 0 for every image."""
  num_classes = 3

  def apply(self, variables, images, train):
    del variables, train
    return jax.numpy.zeros([images.shape[0], 3]).at[:, 0].set(1.0)


@pytest.mark.slow
def test_imagenet_real_scores_the_validation_archive_in_file_name_order(i1k, tmp_path):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import real  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / 'real')
  shutil.copytree(i1k[0], data_dir, ignore=shutil.ignore_patterns('vit_jax_index'))
  sets = [[0], [1, 2], [], [0, 2], [2], [0]]  # of ILSVRC2012_val_00000001 ... 06
  with open(os.path.join(data_dir, 'imagenet2012', releases.REAL_LABELS), 'w') as f:
    json.dump(sets, f)
  release = imagenet.real_release('imagenet2012_real', data_dir)
  spec = specs.eval_spec('resize', 8)
  batches = pipeline.real_label_set_batches(release, 'validation', batch_size=4,
                                            spec=spec, process_index=0,
                                            process_count=1)
  got = np.concatenate([b['label'] for b in batches])[:6]
  np.testing.assert_array_equal(got, [[int(c in s) for c in range(3)] for s in sets])
  mesh = parallel.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1)))
  evaluator = real.RealEvaluator(model=_AlwaysFirstClass(), mesh=mesh, param_shardings=None,
                                 dataset='imagenet2012_real', data_dir=data_dir,
                                 split='validation', batch_size=8, spec=spec)
  assert evaluator({}) == {'accuracy': 3 / 5, 'count': 5.0}  # the empty set is not scored


@pytest.mark.slow
def test_the_input_benchmark_times_both_sources_on_the_same_images(tmp_path):
  from vit_jax.tools.benchmarking import input as input_bench  # pylint: disable=g-import-not-at-top
  paths = input_bench.synthetic_release(str(tmp_path), count=16, classes=2)
  with tarfile.open(os.path.join(paths['archive'], 'imagenet21k', 'synthetic_whole.tar')) as outer:
    inner = {m.name: outer.extractfile(m).read() for m in outer}
  archived = {}
  for name, data in inner.items():
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
      archived.update({f'{name[:-4]}/{m.name}': tar.extractfile(m).read() for m in tar})
  in_folder = {}
  for synset in os.listdir(paths['folder']):
    for name in os.listdir(os.path.join(paths['folder'], synset)):
      with open(os.path.join(paths['folder'], synset, name), 'rb') as f:
        in_folder[f'{synset}/{name}'] = f.read()
  assert archived == in_folder and len(archived) == 16
  sizes = {Image.open(io.BytesIO(d)).size for d in archived.values()}
  assert sizes <= set(input_bench.SHAPES) and len(sizes) > 3
  result = input_bench.run(str(tmp_path), batch_size=8, batches=1, count=16, rounds=1)
  assert result['archive_img_per_s'] > 0 and result['folder_img_per_s'] > 0
  assert result['archive_img_per_s_per_core'] * result['cores'] == result['archive_img_per_s']
  assert 'img/s per core' in input_bench.format_result(result)


# ---------------------------------------------------------------------------------------------
# A release is read as it is laid out, or refused.


def _synset_folders(root, synsets, per_class):
  """root/<synset>/ folders of per_class JPEGs each (no extras), and their images."""
  tars, images = class_tars(synsets, per_class, extras=False)
  for synset, data in tars.items():
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
      tar.extractall(os.path.join(root, synset), filter='data')
  return images


def _i21k_with(tmp_path, make):
  """A data_dir whose imagenet21k/ `make(root)` fills; the release read from it and stderr."""
  data_dir = tmp_path / 'data'
  root = data_dir / 'imagenet21k'
  root.mkdir(parents=True)
  make(root)
  return releases.find('imagenet21k', str(data_dir))


def test_a_stray_tar_beside_synset_folders_is_named_and_left_out(tmp_path, capfd):
  synsets = [f'n0000000{i}' for i in range(6)]

  def make(root):
    _synset_folders(root, synsets, 2)
    (root / 'backup_n00000001.tar').write_bytes(class_tars(['n00000001'], 2, False)[0]['n00000001'])
    (root / 'README.txt').write_text('notes')

  release = _i21k_with(tmp_path, make)
  assert release.classes == tuple(synsets) and release.split_sizes == {'full': 12}
  assert release.splits['full'].index.layout == 'folders'
  err = capfd.readouterr().err
  assert ('2 entries that are no synset (not read): README.txt, backup_n00000001.tar') in err, err


@pytest.mark.parametrize('both', [False, True], ids=['disjoint', 'one_synset_both_ways'])
def test_a_half_unpacked_release_is_refused_naming_both_kinds(tmp_path, both):
  tars, _ = class_tars(['n00000001', 'n00000002'], 2, extras=False)

  def make(root):
    _synset_folders(root, ['n00000003', 'n00000004'] + (['n00000001'] if both else []), 2)
    for synset, data in tars.items():
      (root / f'{synset}.tar').write_bytes(data)

  with pytest.raises(UserError) as e:
    _i21k_with(tmp_path, make)
  line = str(e.value)
  assert ('holds the synsets in two ways: 2 as tars (n00000001.tar, n00000002.tar) and '
          f'{3 if both else 2} as folders (') in line, line
  assert ('n00000001 is there as both' in line) == both and 'finish unpacking' in line, line


def test_links_that_loop_or_leave_the_synset_are_not_followed(tmp_path, capfd):
  """`again -> .` inside a synset gave 972 images for 12 (copies of training images in the eval
  split); a link to another synset's folder would give it a second class."""

  def make(root):
    _synset_folders(root, ['n00000001', 'n00000002'], 12)
    os.symlink('.', root / 'n00000001' / 'again')
    os.symlink('../n00000002', root / 'n00000001' / 'other')
    os.mkdir(root / 'n00000001' / 'sub')
    os.symlink('../sub', root / 'n00000001' / 'sub' / 'up')  # a loop one level down

  release = _i21k_with(tmp_path, make)
  assert release.split_sizes == {'full': 24}
  index = release.splits['full'].index
  names = [index.name(r) for r in range(len(index))]
  assert len(set(names)) == 24 and sum(n.startswith('n00000001/') for n in names) == 12
  err = capfd.readouterr().err
  assert ('3 symbolic links not followed (a loop, or a link out of its synset): '
          'n00000001/again, n00000001/other, n00000001/sub/up') in err, err


def test_a_file_linked_twice_is_read_once_and_one_file_in_two_classes_is_refused(tmp_path, capfd):
  def make(root):
    _synset_folders(root, ['n00000001', 'n00000002'], 3)
    os.symlink('n00000001_0.JPEG', root / 'n00000001' / 'again.JPEG')
    os.link(root / 'n00000001' / 'n00000001_1.JPEG', root / 'n00000001' / 'hard.JPEG')

  release = _i21k_with(tmp_path, make)
  assert release.split_sizes == {'full': 6}
  err = capfd.readouterr().err
  assert ('2 images that are there twice (read once): n00000001/again.JPEG (same file as '
          'n00000001/n00000001_0.JPEG), n00000001/n00000001_1.JPEG (same file as '
          'n00000001/hard.JPEG)') in err, err

  def across(root):
    make(root)
    os.symlink('../n00000001/n00000001_2.JPEG', root / 'n00000002' / 'stolen.JPEG')

  with pytest.raises(UserError, match=r'n00000001_2.JPEG and .*n00000002/stolen.JPEG are the same '
                                      r'file \(a link\) in two classes'):
    _i21k_with(tmp_path / 'across', across)


def test_a_member_stored_twice_in_a_tar_is_read_once_the_last_copy(tmp_path, capfd):
  first, last = jpeg(1), jpeg(2)

  def make(root):
    (root / 'n00000001.tar').write_bytes(tar_bytes([('a.JPEG', first), ('b.JPEG', jpeg(3)),
                                                    ('a.JPEG', last)]))
    (root / 'n00000002.tar').write_bytes(tar_bytes([('c.JPEG', jpeg(4))]))

  release = _i21k_with(tmp_path, make)
  index = release.splits['full'].index
  by_name = {index.name(r): index.read(r) for r in range(len(index))}
  assert by_name == {'n00000001/a.JPEG': last, 'n00000001/b.JPEG': jpeg(3),
                     'n00000002/c.JPEG': jpeg(4)}
  assert '1 image that is there twice (read once): n00000001/a.JPEG' in capfd.readouterr().err


def test_a_class_folder_linked_to_another_is_refused(tmp_path):
  def make(root):
    _synset_folders(root, ['n00000001', 'n00000002'], 2)
    os.symlink('n00000001', root / 'n00000003')

  with pytest.raises(UserError, match=r'n00000001 and .*n00000003 are the same \(a symbolic '
                                      r'link\): an image has one class'):
    _i21k_with(tmp_path, make)


# ---------------------------------------------------------------------------------------------
# Reading: a file changed, gone or unreadable stops the streams with one line, within seconds;
# it is never counted as an image that does not decode.


def _within(seconds: float, fn):
  """fn() run on a thread that must finish within `seconds` (a hang fails the test, not the
  suite); its result, or the error it raised."""
  out = {}

  def run():
    try:
      out['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      out['error'] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f'still running after {seconds} s'
  if 'error' in out:
    raise out['error']
  return out['value']


def _drain(iterator, n=40):
  for _ in range(n):
    next(iterator)


def _stream(data_dir, shuffle_buffer=1):
  return data_lib.train_iterator(dataset='imagenet21k', split='full', data_dir=str(data_dir),
                                 batch_size=8, spec=PP, seed=0, shuffle_buffer=shuffle_buffer)


def test_a_vanished_image_stops_the_train_and_eval_streams_with_one_line(tmp_path, capfd):
  data_dir = tmp_path / 'data'
  _synset_folders(data_dir / 'imagenet21k', ['n00000001', 'n00000002'], 8)
  assert imagenet.load('imagenet21k', str(data_dir)).release.split_sizes == {'full': 16}
  gone = data_dir / 'imagenet21k' / 'n00000002' / 'n00000002_3.JPEG'
  os.remove(gone)
  capfd.readouterr()
  message = (rf'^cannot read {gone} \(No such file or directory; reading '
             r'n00000002/n00000002_3.JPEG\): it is gone: put it back, then rerun the same command '
             r'to resume$')
  with pytest.raises(UserError, match=message):
    _within(120, lambda: _drain(_stream(data_dir)))
  batches, _ = data_lib.eval_iterator(dataset='imagenet21k', split='full', data_dir=str(data_dir),
                                      batch_size=8, spec=specs.eval_spec('resize', 16))
  with pytest.raises(UserError, match=message):
    _within(120, lambda: list(batches))
  assert 'skipped an image' not in capfd.readouterr().err  # a read error is no corrupt image


@pytest.mark.parametrize('fault', ['truncate', 'dd'])
def test_an_archive_cut_or_overwritten_while_read_stops_the_stream(fault, tmp_path, capfd):
  data_dir = tmp_path / 'data'
  write_i21k(str(data_dir))
  whole_tar = data_dir / 'imagenet21k' / 'fall11_whole.tar'
  stream = _stream(data_dir, shuffle_buffer=100)
  next(stream)
  if fault == 'truncate':
    os.truncate(whole_tar, whole_tar.stat().st_size // 2)
  else:  # the same size, other bytes: only its modification time tells
    subprocess.run(['dd', 'if=/dev/urandom', f'of={whole_tar}', 'bs=1k', 'seek=4', 'count=8',
                    'conv=notrunc', 'status=none'], check=True)
  capfd.readouterr()
  with pytest.raises(UserError, match=rf'^{whole_tar} changed since it was indexed: size '):
    _within(120, lambda: _drain(stream, 200))
  skipped = re.findall(r'skipped an image of imagenet21k that does not decode: (\S+)',
                       capfd.readouterr().err)
  assert set(skipped) <= {CORRUPT}, skipped  # (the archive's own corrupt member, read before)


def test_a_train_batch_of_only_undecodable_images_is_one_line_not_a_hang(tmp_path):
  """Every image read but none decodes (damaged in place, its size and time kept): the stream
  used to read on forever without yielding, deaf to SIGTERM."""
  data_dir = tmp_path / 'data'
  _synset_folders(data_dir / 'imagenet21k', ['n00000001', 'n00000002'], 4)
  imagenet.load('imagenet21k', str(data_dir)).release
  for path in (data_dir / 'imagenet21k').glob('*/*.JPEG'):
    st = path.stat()
    path.write_bytes(b'\xff\xd8\xff' + b'\0' * (st.st_size - 3))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # damaged with its time kept (bit rot):
    # a file rewritten in place is a read error instead (test_archive_faults.py)
  with pytest.raises(UserError, match=r'^every image of a train batch failed to decode '
                                      r'\(imagenet21k\): the files are damaged'):
    _within(120, lambda: _drain(_stream(data_dir), 5))


_UNREADABLE = """
import os, sys
from vit_jax import data as data_lib
from vit_jax.data import specs
from vit_jax.data.sources import imagenet
from vit_jax.errors import UserError
data_dir, archive = sys.argv[1:]

def batch():
  imagenet._RELEASES.clear()  # as a new process: the release found and indexed again
  return next(data_lib.train_iterator(dataset='imagenet21k', split='full', data_dir=data_dir,
                                      batch_size=8, spec=specs.train_spec('resize', 16), seed=0))

batch()  # as root: every module imported, the index built
os.seteuid(65534)  # an ordinary user (nobody) from here on
assert batch()['image'].shape == (8, 16, 16, 3)  # the archive is readable to it
os.seteuid(0)
os.chmod(archive, 0)
os.seteuid(65534)
try:
  batch()
except UserError as e:
  print(f'error: {e}')
"""


@pytest.mark.slow
def test_an_archive_made_unreadable_after_indexing_is_one_line(tmp_path):
  """Run as root, where mode 000 does not stop reads, the reader runs as the user `nobody`
  (seteuid in a subprocess) in a folder it may traverse."""
  base = tempfile.mkdtemp()
  try:
    os.chmod(base, 0o755)
    write_i21k(base)
    whole_tar = os.path.join(base, 'imagenet21k', 'fall11_whole.tar')
    proc = subprocess.run([sys.executable, '-c', _UNREADABLE, base, whole_tar], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'PYTHONPATH': ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (
        f'error: cannot read {whole_tar} (Permission denied; reading '
        f'{proc.stdout.split("reading ")[1].split(")")[0]}): fix its permissions, then rerun the '
        f'same command to resume'), proc.stdout
  finally:
    shutil.rmtree(base)


# ---------------------------------------------------------------------------------------------
# The fingerprint covers the contents; where the index goes.


def _other_images_same_shape(data_dir) -> None:
  """fall11_whole.tar replaced by one of the same synsets and counts, other images."""
  tars = {}
  for c, synset in enumerate(SYNSETS):
    files = [(f'{synset}_{i}.JPEG', jpeg(50_000 + 1000 * c + i)) for i in range(PER_CLASS)]
    if synset == 'n00000001':
      files.append((f'{synset}_corrupt.JPEG', b'\xff\xd8\xff' + b'not a jpeg ' * 20))
    if synset == 'n00000003':
      files.append(('readme.txt', b'not an image'))
    tars[synset] = tar_bytes(files)
  whole_tar = os.path.join(data_dir, 'imagenet21k', 'fall11_whole.tar')
  with open(whole_tar, 'wb') as f:
    f.write(tar_bytes([(f'{s}.tar', tars[s]) for s in SYNSETS]))


def test_the_fingerprint_sees_other_images_and_not_a_copy(tmp_path):
  from vit_jax.data import identity  # pylint: disable=g-import-not-at-top
  first, copy = str(tmp_path / 'first'), str(tmp_path / 'copy')
  write_i21k(first)
  identify = lambda data_dir: identity.identify(data_lib.get_info('imagenet21k', data_dir))
  recorded = identify(first)
  shutil.copytree(os.path.join(first, 'imagenet21k'), os.path.join(copy, 'imagenet21k'))
  assert identify(copy) == recorded  # other disk, other times
  _other_images_same_shape(copy)
  imagenet._RELEASES.clear()  # as a new process
  with pytest.raises(UserError, match='vit_jax_index'):  # the index is stale: refused
    identify(copy)
  shutil.rmtree(os.path.join(copy, 'vit_jax_index'))  # as the refusal says
  imagenet._RELEASES.clear()
  current = identify(copy)
  assert current['split_sizes'] == recorded['split_sizes']
  assert current['class_names'] == recorded['class_names']
  assert identity.changes(recorded, current) == [
      f'the images changed (the same classes and split sizes, other files: content '
      f'{recorded["content"]} -> {current["content"]})']
  # A run recorded before identities had a content digest: its names and sizes are checked.
  legacy = {k: v for k, v in recorded.items() if k != 'content'}
  assert identity.changes(dict(legacy, fingerprint='0' * 16), current) == []


@pytest.mark.slow
def test_a_resume_on_a_replaced_archive_of_the_same_shape_is_refused(tmp_path):
  data_dir = str(tmp_path / 'data')
  write_i21k(data_dir)
  c = _recipe('imagenet21k', 2)
  c.data_dir, c.eval_every, c.checkpoint_every, c.warmup_steps = data_dir, 2, 2, 1
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(c, workdir)
  _other_images_same_shape(data_dir)
  imagenet._RELEASES.clear()  # as a new process
  with pytest.raises(UserError, match='was built from other contents of .*: delete that directory'):
    loop.train_and_evaluate(c, workdir)
  shutil.rmtree(os.path.join(data_dir, 'vit_jax_index'))
  imagenet._RELEASES.clear()
  with pytest.raises(UserError, match=r'on other data \(imagenet21k: the images changed \(the '
                                      r'same classes and split sizes, other files: content '):
    loop.train_and_evaluate(c, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']


def test_the_index_is_written_where_vit_jax_index_dir_says(tmp_path, monkeypatch):
  data_dir, elsewhere = tmp_path / 'data', tmp_path / 'elsewhere'
  _synset_folders(data_dir / 'imagenet21k', ['n00000001', 'n00000002'], 2)
  monkeypatch.setenv(archive.DIR_VAR, str(elsewhere))
  index = releases.find('imagenet21k', str(data_dir)).splits['full'].index
  assert os.path.dirname(index.directory) == str(elsewhere) and len(index) == 4
  assert os.listdir(data_dir) == ['imagenet21k']


# ---------------------------------------------------------------------------------------------
# A damaged devkit, ground truth or real.json: one line naming the file.


def _fault(root, fault):
  devkit = os.path.join(root, f'{releases.I1K_DEVKIT}.tar.gz')
  synsets = ('n00000003', 'n00000001', 'n00000002')
  if fault == 'devkit_cut':
    data = open(devkit, 'rb').read()
    open(devkit, 'wb').write(data[:len(data) // 2])
  elif fault == 'devkit_not_gzip':
    open(devkit, 'wb').write(b'this is not a gzip file' * 10)
  elif fault == 'meta_garbage':
    write_devkit(root, b'2\n3\n1\n1\n2\n3\n', os.urandom(2000))
  elif fault == 'id_not_an_integer':
    write_devkit(root, b'2\n3\nx1\n1\n2\n3\n', meta_mat(synsets))
  elif fault == 'id_unknown':
    write_devkit(root, b'2\n3\n1\n9\n2\n3\n', meta_mat(synsets))
  elif fault == 'real_empty':
    open(os.path.join(root, releases.REAL_LABELS), 'w').close()
  elif fault == 'real_cut':
    open(os.path.join(root, releases.REAL_LABELS), 'w').write('[[0], [1, 2], [')
  elif fault == 'real_not_labels':
    open(os.path.join(root, releases.REAL_LABELS), 'w').write('{"a": 1}')


@pytest.mark.parametrize('fault, needle', [
    ('devkit_cut', 'ILSVRC2012_devkit_t12.tar.gz is not a readable .tar.gz ('),
    ('devkit_not_gzip', 'ILSVRC2012_devkit_t12.tar.gz is not a readable .tar.gz ('),
    ('meta_garbage', "meta.mat is not the devkit's meta.mat ("),
    ('id_not_an_integer', "ILSVRC2012_validation_ground_truth.txt line 3 is 'x1', not one of "
                          'the ILSVRC ids 1-3 of its meta.mat'),
    ('id_unknown', "ILSVRC2012_validation_ground_truth.txt line 4 is '9', not one of the ILSVRC "
                   'ids 1-3'),
    ('real_empty', 'real.json is not readable JSON ('),
    ('real_cut', 'real.json is not readable JSON ('),
    ('real_not_labels', 'real.json is not a list of label sets (lists of class numbers 0-2)'),
])
def test_a_damaged_devkit_ground_truth_or_real_json_is_one_line(fault, needle, i1k, tmp_path):
  data_dir = str(tmp_path / 'data')
  shutil.copytree(i1k[0], data_dir, ignore=shutil.ignore_patterns('vit_jax_index'))
  root = os.path.join(data_dir, 'imagenet2012')
  _fault(root, fault)
  with pytest.raises(UserError) as e:
    releases.real_label_sets(releases.find('imagenet2012', data_dir))
  assert needle in str(e.value) and '\n' not in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# The trainer, with real faults while it runs: one line or a saved stop, never a hang.


class _Trainer:
  """`python -m vit_jax.main` on imagenet21k in `data_dir`, its stderr lines collected."""

  def __init__(self, data_dir, workdir, *args):
    self.lines = []
    self.proc = subprocess.Popen(
        [sys.executable, '-m', 'vit_jax.main', '--config=configs/pretrain.py:model=B/16,'
         'dataset=imagenet21k', f'--workdir={workdir}', f'--config.data_dir={data_dir}',
         *(a for a in TINY if 'total_epochs' not in a), '--config.total_epochs=None',
         '--config.train_split=full[8:]', '--config.eval_split=full[:8]', *args],
        cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, 'VIT_JAX_HUGEPAGES': '0'})
    threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

  def wait_for(self, text: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not any(text in line for line in self.lines):
      assert self.proc.poll() is None and time.monotonic() < deadline, ''.join(self.lines)
      time.sleep(0.01)

  def end(self, seconds: float = 120) -> int:
    try:
      return self.proc.wait(seconds)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      raise AssertionError(f'still running {seconds} s later:\n{"".join(self.lines)}') from None

  @property
  def stderr(self) -> str:
    time.sleep(0.2)  # the reader thread's last lines
    return ''.join(self.lines)


@pytest.mark.slow
def test_an_archive_overwritten_during_training_stops_the_run_with_one_line(tmp_path):
  """A real `dd ... conv=notrunc` over the archive while the run trains: it used to go on at
  160% CPU with no output, deaf to SIGTERM and Ctrl-C."""
  data_dir = tmp_path / 'data'
  write_i21k(str(data_dir))
  whole_tar = data_dir / 'imagenet21k' / 'fall11_whole.tar'
  trainer = _Trainer(data_dir, tmp_path / 'run', '--config.total_steps=100000',
                     '--config.checkpoint_every=20', '--config.eval_every=100000')
  trainer.wait_for('training on')
  time.sleep(3)
  subprocess.run(['dd', 'if=/dev/urandom', f'of={whole_tar}', 'bs=1k', 'seek=4', 'count=8',
                  'conv=notrunc', 'status=none'], check=True)
  start = time.monotonic()
  assert trainer.end() == 2
  took = time.monotonic() - start
  err = trainer.stderr
  lines = err.strip().splitlines()
  assert lines[-1].startswith(f'error: {whole_tar} changed since it was indexed: size '), err
  assert 'Put the files back as they were and rerun the same command' in lines[-1]
  assert 'Traceback' not in err and took < 60, (took, err)


@pytest.mark.slow
def test_sigterm_while_the_input_is_blocked_saves_and_exits(tmp_path):
  """Every image replaced by a named pipe, whose open blocks as a hung file system's read does:
  the input pipeline waits inside TensorFlow, and SIGTERM still saves the last step and exits."""
  data_dir = tmp_path / 'data'
  root = data_dir / 'imagenet21k'
  _synset_folders(root, SYNSETS, 6)
  trainer = _Trainer(data_dir, tmp_path / 'run', '--config.total_steps=100000',
                     '--config.checkpoint_every=100000', '--config.eval_every=100000',
                     '--config.log_every=1')
  log = tmp_path / 'run' / 'metrics.jsonl'
  deadline = time.monotonic() + 300
  while not (log.exists() and log.read_text()):  # it trains
    assert trainer.proc.poll() is None and time.monotonic() < deadline, trainer.stderr
    time.sleep(0.05)
  for path in root.glob('*/*.JPEG'):
    path.unlink()
    os.mkfifo(path)
  time.sleep(10)  # the batches read before are used up; the pipeline blocks
  assert trainer.proc.poll() is None, trainer.stderr
  trainer.proc.send_signal(signal.SIGTERM)
  start = time.monotonic()
  assert trainer.end() == 0, trainer.stderr
  took = time.monotonic() - start
  err = trainer.stderr
  saved = re.search(r'preempted while waiting for the input: saved the checkpoint of step (\d+) in '
                    r'\S+; rerun the same command to resume', err)
  assert saved and took < 60, (took, err)
  step = int(saved.group(1))
  assert os.listdir(tmp_path / 'run' / 'checkpoints') == [str(step)]
  logged = [r['step'] for r in map(json.loads, open(tmp_path / 'run' / 'metrics.jsonl'))]
  assert logged[-1] == step  # the steps since the last record are logged with the checkpoint


def _children(pid: int, what: str):
  """The processes whose parent is `pid` and whose command line holds `what`."""
  out = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          parent = int(f.read().rsplit(')', 1)[1].split()[1])
        with open(f'/proc/{entry}/cmdline', 'rb') as f:
          cmdline = f.read().decode(errors='replace')
      except (OSError, ValueError, IndexError):
        continue
      if parent == pid and what in cmdline:
        out.append(int(entry))
  return out


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


@pytest.mark.slow
@pytest.mark.parametrize('how', ['SIGTERM', 'SIGHUP_to_the_group'])
def test_a_signal_while_indexing_is_one_line_and_leaves_no_index_that_is_trusted(how, tmp_path):
  """The indexing processes are frozen (SIGSTOP) once the first part is written, so the signal
  surely comes while indexing; they used to print BrokenPipeError tracebacks and the trainer
  nothing."""
  data_dir = tmp_path / 'data'
  root = data_dir / 'imagenet21k'
  root.mkdir(parents=True)
  for i in range(400):
    (root / f'n{i:08d}.tar').write_bytes(tar_bytes([(f'{i}.JPEG', jpeg(i, (8, 8)))]))
  parts = os.path.join(archive.index_dir(str(root), 'tars', str(data_dir / 'vit_jax_index')),
                       'parts')
  trainer = _Trainer(data_dir, tmp_path / 'run', '--config.total_steps=10')
  deadline = time.monotonic() + 300
  written = lambda: [n for n in os.listdir(parts) if re.fullmatch(r'[0-9]{7}\.npz', n)]
  while not (os.path.isdir(parts) and written()):
    assert trainer.proc.poll() is None and time.monotonic() < deadline, trainer.stderr
    time.sleep(0.002)
  workers = _children(trainer.proc.pid, 'spawn_main')
  for pid in workers:
    os.kill(pid, signal.SIGSTOP)
  try:
    assert workers and len(written()) < 400
    if how == 'SIGTERM':
      trainer.proc.send_signal(signal.SIGTERM)
    else:  # a closed terminal hangs up its whole process group
      os.killpg(trainer.proc.pid, signal.SIGHUP)
    assert trainer.end() == 2
  finally:
    for pid in workers:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
  err = trainer.stderr
  name = how.split('_')[0]
  assert err.strip().splitlines()[-1].startswith(
      f'error: stopped by {name} while indexing {root}: '), err
  assert 'rerun the same command to index the rest' in err and 'Traceback' not in err, err
  time.sleep(1)
  assert not [pid for pid in workers if _alive(pid)]
  directory = os.path.dirname(parts)
  assert not os.path.exists(os.path.join(directory, 'done.json'))
  assert not [n for n in os.listdir(parts) + os.listdir(directory) if '.tmp' in n]
  kept = sorted(int(n[:7]) for n in os.listdir(parts))
  assert 0 < len(kept) < 400
  built = []
  index = archive.load(str(root), 'tars', str(data_dir / 'vit_jax_index'), workers=2,
                             on_part=built.append)
  assert sorted(built) == sorted(set(range(400)) - set(kept))  # only the missing parts
  fresh = archive.load(str(root), 'tars', str(tmp_path / 'fresh'), workers=2)
  for key in ('unit', 'file', 'offset', 'size', 'names', 'name_ends', 'hash_order'):
    np.testing.assert_array_equal(getattr(index, key), getattr(fresh, key))
  assert index.content == fresh.content


def test_a_class_folder_inside_another_is_refused_and_a_link_to_the_root_is_not_followed(
    tmp_path, capfd):
  def nested(root):
    _synset_folders(root, ['n00000001', 'n00000002'], 2)
    os.mkdir(root / 'n00000001' / 'sub')
    os.symlink('n00000001/sub', root / 'n00000003')

  with pytest.raises(UserError, match=r'n00000001 and .*n00000003 hold the same images \(one is '
                                      r'inside the other\)'):
    _i21k_with(tmp_path / 'nested', nested)

  def loop(root):
    _synset_folders(root, ['n00000001', 'n00000002'], 2)
    os.symlink('.', root / 'n00000009')

  release = _i21k_with(tmp_path / 'loop', loop)
  assert release.classes == ('n00000001', 'n00000002') and release.split_sizes == {'full': 4}
  assert '1 symbolic link not followed (a loop, or a link out of its synset): n00000009' in \
      capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# A zip read in place: stored members as they are, deflated ones inflated and CRC-checked.

_ZIPPED = [('sketch/', b'', zipfile.ZIP_STORED),
           ('sketch/n00000001/a.JPEG', jpeg(1), zipfile.ZIP_DEFLATED),
           ('sketch/n00000001/b.JPEG+', jpeg(2), zipfile.ZIP_STORED),
           ('sketch/n00000002/c.JPEG+', jpeg(3), zipfile.ZIP_DEFLATED),
           ('sketch/n00000002/.hidden.JPEG', jpeg(4), zipfile.ZIP_STORED),
           ('sketch/n00000002/d.JPEG', jpeg(7), (zipfile.ZIP_DEFLATED, 0)),
           ('sketch/README.txt', b'read me' * 50, zipfile.ZIP_DEFLATED),
           ('sketch/n00000001/a.JPEG', jpeg(5), zipfile.ZIP_STORED)]  # stored twice: the last


def _zip_index(tmp_path, blob: bytes, name='set.zip'):
  path = tmp_path / name
  path.write_bytes(blob)
  return archive.load(str(path), 'flat_zip', str(tmp_path / 'index'))


def test_a_zip_is_read_in_place_its_deflated_members_inflated(tmp_path):
  blob = zip_bytes(_ZIPPED)
  # Bytes after the zip's end (as after a tar's end-of-archive blocks) are not read.
  index = _zip_index(tmp_path, blob + b'\0' * 100)
  images = {index.name(r): index.read(r) for r in range(len(index))}
  assert images == {'sketch/n00000001/a.JPEG': jpeg(5), 'sketch/n00000001/b.JPEG': jpeg(2),
                    'sketch/n00000002/c.JPEG': jpeg(3), 'sketch/n00000002/d.JPEG': jpeg(7)}
  assert index.notes['non_image'] == ['sketch/README.txt']
  assert index.notes['duplicate'] == ['sketch/n00000001/a.JPEG']
  by_name = {index.name(r): r for r in range(len(index))}
  assert index.method[by_name['sketch/n00000002/c.JPEG']] == zipfile.ZIP_DEFLATED
  # The rows address the zip's own bytes: a deflated member's, not its inflated image.
  row = by_name['sketch/n00000002/c.JPEG']
  assert (int(index.offset[row]), int(index.size[row])) == zip_data_range(
      blob, 'sketch/n00000002/c.JPEG')
  assert sorted(os.listdir(tmp_path)) == ['index', 'set.zip']  # nothing unpacked
  # An index without a zip has no zip columns: indexes built before zips were read stay valid.
  (tmp_path / 'imgs.tar').write_bytes(tar_bytes([('x.jpg', jpeg(6))]))
  tar_index = archive.load(str(tmp_path / 'imgs.tar'), 'flat_tar', str(tmp_path / 'index'))
  assert tar_index.method is None and tar_index.read(0) == jpeg(6)
  with np.load(os.path.join(tar_index.directory, 'index.npz')) as a:
    assert 'method' not in a.files


def _flag_encrypted(blob: bytes, name: str) -> bytes:
  """`blob` with member `name` flagged encrypted (bit 0 of its general purpose flags) in its
  local and central headers: Python's zipfile cannot write an encrypted member."""
  out = bytearray(blob)
  encoded = name.encode()
  for signature, flags, name_at in ((b'PK\x03\x04', 6, 30), (b'PK\x01\x02', 8, 46)):
    at = out.find(signature)
    while at >= 0 and out[at + name_at:at + name_at + len(encoded)] != encoded:
      at = out.find(signature, at + 4)
    out[at + flags] |= 1
  return bytes(out)


def test_an_encrypted_or_otherwise_compressed_zip_member_is_refused_in_one_line(tmp_path):
  files = [('imgs/a.jpg', jpeg(1), zipfile.ZIP_STORED), ('imgs/b.jpg', jpeg(2),
                                                         zipfile.ZIP_DEFLATED)]
  blob = _flag_encrypted(zip_bytes(files), 'imgs/b.jpg')
  with pytest.raises(UserError) as e:
    _zip_index(tmp_path, blob, 'locked.zip')
  assert re.fullmatch(r'\S+/locked.zip: its member imgs/b.jpg is encrypted, which cannot be read '
                      r'in place: unpack it once \(`unzip locked.zip` in \S+\) and read the '
                      r'folder it unpacks into', str(e.value)), str(e.value)
  blob = zip_bytes(files[:1] + [('imgs/c.jpg', jpeg(3), zipfile.ZIP_BZIP2)])
  with pytest.raises(UserError, match=r'bz.zip: its member imgs/c.jpg is compressed by method '
                                      r'12, not stored or deflated, .* \(`unzip bz.zip` in'):
    _zip_index(tmp_path, blob, 'bz.zip')
  with pytest.raises(UserError, match=r'no.zip is not a readable zip \(.*\): download it again$'):
    _zip_index(tmp_path, jpeg(1), 'no.zip')


def test_a_zip_changed_after_indexing_is_refused_in_one_line(tmp_path):
  blob = zip_bytes(_ZIPPED)
  index = _zip_index(tmp_path, blob)
  path = tmp_path / 'set.zip'
  for changed in (blob + b'appended', blob[:len(blob) // 2]):
    path.write_bytes(changed)
    with pytest.raises(archive.ReadError, match=r'set.zip changed since it was indexed: size '
                                                rf'{len(changed)}, .* and rerun'):
      index.read(0)
    with pytest.raises(UserError, match=r'the index in \S+ was built from other contents of '
                                        r'\S+set.zip \(1 changed: set.zip\): delete'):
      archive.load(str(path), 'flat_zip', str(tmp_path / 'index'))


def _damage(blob: bytes, name: str) -> bytes:
  """`blob` with one byte of member `name`'s stored data changed (its length kept)."""
  offset, size = zip_data_range(blob, name)
  out = bytearray(blob)
  out[offset + size // 2] ^= 0xFF
  return bytes(out)


def test_a_damaged_deflated_zip_member_is_one_line_naming_it(tmp_path):
  blob = zip_bytes(_ZIPPED)
  # d.JPEG is deflated in stored blocks: a byte changed still inflates, to data of another CRC.
  damaged = _damage(blob, 'sketch/n00000002/d.JPEG')
  line = (r'\S+set.zip: its member sketch/n00000002/d.JPEG is damaged \(its data does not match '
          r'the CRC-32 the zip records\): download the zip again, then rerun$')
  with pytest.raises(UserError, match=line):  # at indexing
    _zip_index(tmp_path, damaged)
  # Damaged after indexing, its size and time kept: the read inflates it and checks it.
  fresh = tmp_path / 'fresh'
  fresh.mkdir()
  index = _zip_index(fresh, blob)
  path = fresh / 'set.zip'
  st = os.stat(path)
  with open(path, 'r+b') as f:
    f.write(damaged)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  rows = {index.name(r): r for r in range(len(index))}
  assert index.read(rows['sketch/n00000001/b.JPEG']) == jpeg(2)
  with pytest.raises(archive.ReadError, match=line):
    index.read(rows['sketch/n00000002/d.JPEG'])
  # A byte changed in a Huffman-coded member: its stream no longer inflates.
  with open(path, 'r+b') as f:
    f.write(_damage(blob, 'sketch/n00000002/c.JPEG'))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  with pytest.raises(archive.ReadError, match=line.replace('d.JPEG', 'c.JPEG')):
    index.read(rows['sketch/n00000002/c.JPEG'])
