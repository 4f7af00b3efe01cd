"""`dataset='folder:PATH'`: listing, the documented split, skipped files, the cache, and the
data pipelines (resumption, per-process shares) on a folder written by the test."""

import hashlib
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from image_folder_util import COLOURS, write_colour_folder
from vit_jax import data as data_lib
from vit_jax.data import folder
from vit_jax.errors import UserError

PP = dict(crop='resize', image_size=16)


@pytest.fixture(scope='module')
def images(tmp_path_factory):
  root = tmp_path_factory.mktemp('folder') / 'colours'
  files = write_colour_folder(str(root))
  return str(root), files


@pytest.mark.parametrize('n, k', [(1, 0), (2, 1), (5, 1), (9, 1), (14, 1), (15, 2), (25, 3),
                                  (100, 10)])
def test_test_images_per_class(n, k):
  assert folder.num_test(n) == k


def test_split_is_the_documented_hash_order():
  items = [(f'c{label}/{i}.png', label) for label in range(2) for i in range(15)]
  splits = folder.assign_splits(items)
  assert folder.assign_splits(list(reversed(items))) == splits  # independent of listing order
  for label in range(2):
    rels = [r for r, l in items if l == label]
    by_hash = sorted(rels, key=lambda r: hashlib.sha256(r.encode()).digest())
    assert sorted(r for r, l in splits['test'] if l == label) == sorted(by_hash[:2])  # 15 -> 2
  assert len(splits['train']) == 26 and not set(splits['train']) & set(splits['test'])


def test_prepare_skips_and_counts_then_reuses_the_cache(images, tmp_path, capfd):
  root, files = images
  cache = str(tmp_path / 'cache')
  info = data_lib.get_info(f'folder:{root}', cache)
  err = capfd.readouterr().err
  # 36 readable images, 12 per class -> round(1.2) = 1 test image per class.
  assert (f'prepared folder:{root}: 3 classes, 36 images (33 train, 3 test); skipped 1 corrupt '
          'file (red/broken.jpg) and 2 non-image files (green/anim.gif, notes.txt)') in err, err
  assert info.num_classes == 3 and info.image_shape == (None, None, 3)
  assert info.split_sizes == {'train': 33, 'test': 3}
  assert info.tfds_info.features['label'].names == list(COLOURS)
  assert info.tfds_info.metadata['skipped_corrupt'] == ['red/broken.jpg']
  assert info.tfds_info.metadata['skipped_non_image'] == ['green/anim.gif', 'notes.txt']

  # Records hold the files' bytes unchanged, labelled by their class folder.
  builder = data_lib.info.load_builder(f'folder:{root}', cache)
  ds = builder.as_dataset(split='train+test', decoders={'image': tfds.decode.SkipDecoding()})
  seen = {}
  for ex in tfds.as_numpy(ds):
    rel = ex['path'].decode()
    with open(os.path.join(root, rel), 'rb') as f:
      assert ex['image'] == f.read(), rel
    seen[rel] = int(ex['label'])
  assert seen == files

  assert data_lib.get_info(f'folder:{root}', cache).split_sizes == {'train': 33, 'test': 3}
  assert 'prepared' not in capfd.readouterr().err  # the cache is reused, nothing re-read

  changed = tmp_path / 'changed'
  shutil.copytree(root, changed)
  os.remove(changed / 'red' / 'broken.jpg')
  info = data_lib.get_info(f'folder:{changed}', cache)
  assert ('36 images (33 train, 3 test); skipped 2 non-image files (green/anim.gif, notes.txt); '
          'cached in') in capfd.readouterr().err
  assert info.split_sizes == {'train': 33, 'test': 3}
  assert len(os.listdir(os.path.join(cache, 'image_folders'))) == 2


def _message(tmp_path, make):
  root = tmp_path / 'root'
  if root.is_dir():
    shutil.rmtree(root)
  elif root.exists():
    root.unlink()
  make(root)
  with pytest.raises(UserError) as e:
    data_lib.get_info(f'folder:{root}', str(tmp_path / 'cache'))
  assert '\n' not in str(e.value)
  return str(e.value)


def _class_dirs(root, names, files=()):
  for name in names:
    (root / name).mkdir(parents=True)
  for rel, content in files:
    (root / rel).write_bytes(content)


def test_user_errors(tmp_path):
  assert 'does not exist' in _message(tmp_path, lambda r: None)
  assert 'is not a directory' in _message(tmp_path, lambda r: r.write_text('x'))
  assert 'has no class sub-folders' in _message(tmp_path, lambda r: r.mkdir())  # empty
  assert 'has no class sub-folders' in _message(tmp_path, lambda r: (
      r.mkdir(), (r / 'a.png').write_bytes(b'x'), (r / '.hidden').mkdir()))
  assert 'has one class sub-folder (cats)' in _message(tmp_path, lambda r: _class_dirs(
      r, ['cats'], [('cats/a.png', b'x')]))
  text = _message(tmp_path, lambda r: _class_dirs(
      r, ['cats', 'dogs'], [('cats/a.png', b'not a png'), ('dogs/b.jpg', b'nope'),
                            ('dogs/c.txt', b'')]))
  assert ('class folder cats has no readable JPEG/PNG image (2 such folders) (2 corrupt and 1 '
          'non-image files skipped') in text, text
  with pytest.raises(UserError, match='names no folder'):
    data_lib.get_info('folder:', None)
  assert not (tmp_path / 'cache' / 'image_folders').exists() or not os.listdir(
      tmp_path / 'cache' / 'image_folders')  # nothing was written for a rejected folder


@pytest.mark.slow
def test_train_stream_resumes_exactly_and_processes_share_the_split(images, tmp_path):
  root, _ = images
  cache = str(tmp_path / 'cache')
  kwargs = dict(dataset=f'folder:{root}', split='train', data_dir=cache, batch_size=4,
                pp=dict(PP, flip=True), seed=3, shuffle_buffer=100)
  stream = data_lib.train_iterator(**kwargs)
  full = [next(stream) for _ in range(10)]  # 40 examples: crosses into the second epoch (33)
  resumed = data_lib.train_iterator(**kwargs, start_step=7)
  for want in full[7:]:
    got = next(resumed)
    np.testing.assert_array_equal(got['image'], want['image'])
    np.testing.assert_array_equal(got['label'], want['label'])
  assert full[0]['image'].shape == (4, 16, 16, 3)

  counts = []
  for index in range(2):
    batches, n = data_lib.eval_iterator(dataset=f'folder:{root}', split='train', data_dir=cache,
                                        batch_size=8, pp=PP, process_index=index,
                                        process_count=2)
    masks = np.concatenate([b['mask'] for b in batches])
    assert n == 3 and len(masks) == 24  # both processes yield the same number of batches
    counts.append(int(masks.sum()))
  assert counts == [17, 16]  # the 33 train images, each read by one process


def test_a_folder_name_too_long_to_prepare_is_one_line_naming_the_cause(tmp_path):
  """The prepared copy's directory is named after the folder: a 245-character name makes it too
  long for the file system, which is said as such (not as a full disk)."""
  root = tmp_path / ('a' * 245)
  write_colour_folder(root, per_class=2)
  with pytest.raises(UserError) as err:
    folder.prepare(str(root), str(tmp_path / 'data'))
  line = str(err.value)
  assert '\n' not in line and 'File name too long' in line, line
  assert 'shorter file or folder names' in line and 'free space' not in line, line
