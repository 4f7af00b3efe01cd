"""ImageNet-21k and ImageNet-1k read in place from their releases (vit_jax/data/releases.py,
archive_index.py), on fake releases the tests write: a tar of per-synset tars of small JPEGs with
one corrupt member and one non-image, and an ILSVRC2012 layout (train tar of tars, validation
tar, devkit)."""

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

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
from vit_jax.data import archive_index, info, releases, specs
from vit_jax.errors import UserError
from vit_jax.train import loop

SYNSETS = ('n00000004', 'n00000001', 'n00000003', 'n00000002')  # archive order: not sorted
PER_CLASS = 12
CORRUPT = 'n00000001/n00000001_corrupt.JPEG'
PP = dict(crop='inception', image_size=16, flip=True)
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
  meta = io.BytesIO()
  scipy.io.savemat(meta, {'synsets': np.array(
      [(i + 1, s, 0) for i, s in enumerate(synsets)],
      dtype=[('ILSVRC2012_ID', 'O'), ('WNID', 'O'), ('num_children', 'O')])})
  devkit = io.BytesIO()
  with tarfile.open(fileobj=devkit, mode='w:gz') as tar:
    for name, data in ((releases.I1K_GROUND_TRUTH, ''.join(f'{i}\n' for i in ids).encode()),
                       ('meta.mat', meta.getvalue())):
      member = tarfile.TarInfo(f'{releases.I1K_DEVKIT}/data/{name}')
      member.size = len(data)
      tar.addfile(member, io.BytesIO(data))
  with open(os.path.join(root, f'{releases.I1K_DEVKIT}.tar.gz'), 'wb') as f:
    f.write(devkit.getvalue())
  labels = [sorted(synsets).index(synsets[i - 1]) for i in ids]
  return data_dir, labels


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
  whole = info.find_release('imagenet21k', data_dir).splits['full']
  assert unpacked.index.layout == layout and unpacked.index.skipped_non_images == 1
  names = [unpacked.index.name(r) for r in unpacked.rows]
  assert names == [whole.index.name(r) for r in whole.rows]
  assert [unpacked.index.read(r) for r in unpacked.rows] == [images[n] for n in names]
  np.testing.assert_array_equal(unpacked.labels, whole.labels)


_KILLED_BUILD = """
import sys, time
from vit_jax.data import archive_index
archive_index.build(sys.argv[1], 'tars', sys.argv[2], workers=1,
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
  directory = archive_index.index_dir(str(root), 'tars', base)
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
  index = archive_index.load(str(root), 'tars', base, workers=2, on_part=built.append)
  assert sorted(built) == sorted(set(range(12)) - done_before)  # only the missing parts
  assert sorted(index.name(r) for r in range(len(index))) == sorted(images)
  assert all(index.read(r) == images[index.name(r)] for r in range(len(index)))
  fresh = archive_index.load(str(root), 'tars', str(tmp_path / 'fresh'), workers=1)
  for key in ('unit', 'file', 'offset', 'size', 'names', 'name_ends', 'hash_order'):
    np.testing.assert_array_equal(getattr(index, key), getattr(fresh, key))


def test_hosts_sharing_a_directory_split_the_units(tmp_path):
  root, _ = _tar_folder(tmp_path, 5, 1)
  base = str(tmp_path / 'index')
  second = []
  with pytest.raises(UserError, match='still misses parts of other hosts'):
    archive_index.build(str(root), 'tars', base, shard=(1, 2), workers=1, wait_s=0,
                        on_part=second.append)
  first = []
  archive_index.build(str(root), 'tars', base, shard=(0, 2), workers=1, on_part=first.append)
  assert (sorted(first), sorted(second)) == ([0, 2, 4], [1, 3])
  assert len(archive_index.load(str(root), 'tars', base, shard=(1, 2))) == 5


# ---------------------------------------------------------------------------------------------
# The streams.


def _batches(data_dir, n, **kwargs):
  it = data_lib.train_iterator(dataset='imagenet21k', split='full', data_dir=data_dir,
                               batch_size=8, pp=PP, seed=3, **kwargs)
  return [next(it) for _ in range(n)]


@pytest.mark.slow
def test_the_train_stream_resumes_exactly_and_skips_the_corrupt_image(i21k, capfd):
  data_dir, images = i21k
  capfd.readouterr()
  full = _batches(data_dir, 13, shuffle_buffer=1000)  # 104 positions: two epochs of 49
  err = capfd.readouterr().err
  assert f'skipped an image of imagenet21k that does not decode: {CORRUPT} (1 so far' in err, err
  assert f'{CORRUPT} (2 so far' in err and f'{CORRUPT} (3 so far' not in err  # once an epoch
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
  pp = dict(crop='resize', image_size=16)
  it = data_lib.train_iterator(dataset='imagenet21k', split='full[8:16]', data_dir=data_dir,
                               batch_size=8, pp=pp, seed=0, shuffle_buffer=1)
  batch = next(it)
  split = info.find_release('imagenet21k', data_dir).splits['full']
  for i, row in enumerate(split.rows[8:16]):
    name = split.index.name(row)
    assert name != CORRUPT  # (the fixed hash order puts it in full[:8])
    image = preprocess.decode(tf.constant(images[name]), 3)
    np.testing.assert_array_equal(
        batch['image'][i], preprocess.train_preprocess(image, tf.constant([0, 0], tf.int64),
                                                       specs.train_spec(pp)).numpy())
    assert batch['label'][i] == sorted(SYNSETS).index(name.split('/')[0])


@pytest.mark.slow
def test_two_processes_read_disjoint_shards_that_cover_the_split(i21k):
  data_dir, images = i21k
  release = info.find_release('imagenet21k', data_dir)
  split = 'full[9:]'
  shares = [releases.records(release, s)[0] for s in tfds.even_splits(split, n=2)]
  assert not set(shares[0]) & set(shares[1])
  assert sorted(np.concatenate(shares)) == sorted(releases.records(release, split)[0])
  assert [len(s) for s in shares] == [20, 20]
  # The eval batches: each image once over both processes, the corrupt one masked out.
  seen = []
  for index in range(2):
    batches, n = data_lib.eval_iterator(dataset='imagenet21k', split='full', data_dir=data_dir,
                                        batch_size=8, pp=dict(crop='central', image_size=16, resize=18),
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
  assert not os.path.exists(os.path.join(data_dir, dataset, 'image_folders'))  # no copy


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
  archive = cut / 'imagenet21k' / 'fall11_whole.tar'
  data = archive.read_bytes()
  archive.write_bytes(data[:len(data) * 2 // 3])
  assert 'is truncated' in _error_line(cut, tmp_path)


@pytest.mark.slow
def test_the_index_of_a_changed_archive_is_refused(tmp_path):
  data_dir = tmp_path / 'changed'
  write_i21k(str(data_dir))
  data_lib.get_info('imagenet21k', str(data_dir))  # indexed
  archive = data_dir / 'imagenet21k' / 'fall11_whole.tar'
  tars, _ = class_tars(SYNSETS[:3], 5)
  archive.write_bytes(tar_bytes([(f'{s}.tar', tars[s]) for s in SYNSETS[:3]]))
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
  release = info.real_release('imagenet2012_real', data_dir)
  pp = dict(crop='resize', image_size=8)
  batches = pipeline.real_label_set_batches(release, 'validation', batch_size=4,
                                            spec=specs.eval_spec(pp), process_index=0,
                                            process_count=1)
  got = np.concatenate([b['label'] for b in batches])[:6]
  np.testing.assert_array_equal(got, [[int(c in s) for c in range(3)] for s in sets])
  mesh = parallel.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1)))
  evaluator = real.RealEvaluator(model=_AlwaysFirstClass(), mesh=mesh, param_shardings=None,
                                 dataset='imagenet2012_real', data_dir=data_dir,
                                 split='validation', batch_size=8, pp=pp)
  assert evaluator({}) == {'accuracy': 3 / 5, 'count': 5.0}  # the empty set is not scored


@pytest.mark.slow
def test_the_input_benchmark_times_both_sources_on_the_same_images(tmp_path):
  from vit_jax.benchmarking import input as input_bench  # pylint: disable=g-import-not-at-top
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
  assert result['archive_img_per_s'] > 0 and result['tfds_copy_img_per_s'] > 0
  assert result['archive_img_per_s_per_core'] * result['cores'] == result['archive_img_per_s']
  assert 'img/s per core' in input_bench.format_result(result)
