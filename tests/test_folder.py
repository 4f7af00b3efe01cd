"""`dataset='folder:PATH'`: listing, the documented split, skipped files, the cache, and the
data pipelines (resumption, per-process shares) on a folder written by the test."""

import hashlib
import os
import shutil

import numpy as np
import pytest

from helpers import file_tree
from image_folder_util import COLOURS, write_colour_folder, write_noisy_jpeg
from vit_jax import data as data_lib
from vit_jax.data import folder, specs
from vit_jax.errors import UserError

PP = specs.eval_spec('resize', 16)


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


def test_the_folder_is_read_in_place_skipping_and_counting_then_reusing_its_index(
    images, tmp_path, capfd):
  root, files = images
  cache = str(tmp_path / 'cache')
  info = data_lib.get_info(f'folder:{root}', cache)
  err = capfd.readouterr().err
  # 36 readable images, 12 per class -> round(1.2) = 1 test image per class.
  assert (f'prepared folder:{root}: 3 classes, 36 images (33 train, 3 test); skipped 1 corrupt '
          'file (red/broken.jpg) and 2 non-image files (green/anim.gif, notes.txt)') in err, err
  assert info.num_classes == 3 and info.image_shape == (None, None, 3)
  assert info.split_sizes == {'train': 33, 'test': 3}
  assert info.class_names == COLOURS
  assert info.skipped == {'corrupt': ('red/broken.jpg',),
                          'non_image': ('green/anim.gif', 'notes.txt')}

  # Each record reads its file's bytes unchanged, in place, labelled by its class folder; the
  # test split is the documented rule's.
  seen, test = {}, []
  for name, split in info.release.splits.items():
    for row, label in zip(split.rows, split.labels):
      rel = split.index.name(row)
      with open(os.path.join(root, rel), 'rb') as f:
        assert split.index.read(row) == f.read(), rel
      seen[rel] = int(label)
      test += [(rel, int(label))] if name == 'test' else []
  assert seen == files
  assert sorted(test) == sorted(folder.assign_splits(sorted(files.items()))['test'])
  # No copy: nothing written holds an image's bytes, and the index is small metadata.
  written = file_tree(cache)
  image_bytes = [open(os.path.join(root, rel), 'rb').read() for rel in files]
  assert not any(image in blob for blob in written.values() for image in image_bytes)
  assert sum(map(len, written.values())) < sum(map(len, image_bytes)) / 2

  assert data_lib.get_info(f'folder:{root}', cache).split_sizes == {'train': 33, 'test': 3}
  assert 'prepared' not in capfd.readouterr().err  # the index is reused, nothing re-read

  changed = tmp_path / 'changed'
  shutil.copytree(root, changed)
  os.remove(changed / 'red' / 'broken.jpg')
  info = data_lib.get_info(f'folder:{changed}', cache)
  assert ('36 images (33 train, 3 test); skipped 2 non-image files (green/anim.gif, notes.txt); '
          'read in place, indexed in') in capfd.readouterr().err
  assert info.split_sizes == {'train': 33, 'test': 3}
  assert len(os.listdir(os.path.join(cache, 'vit_jax_index'))) == 2


def test_a_file_rewritten_in_place_is_a_new_index_and_other_data(images, tmp_path, capfd):
  """The index's directory is named by every file's size and time: a file rewritten (same name,
  same size, other pixels) is indexed again, and the content digest differs."""
  root = tmp_path / 'copy'
  shutil.copytree(images[0], root)
  cache = str(tmp_path / 'cache')
  before = data_lib.get_info(f'folder:{root}', cache).release.content
  target = root / 'blue' / '0.jpg'
  data = bytearray(target.read_bytes())
  data[-10] ^= 0xFF  # the last bytes of the entropy-coded data
  target.write_bytes(bytes(data))
  capfd.readouterr()
  after = data_lib.get_info(f'folder:{root}', cache).release.content
  assert 'prepared folder:' in capfd.readouterr().err and before != after
  # The index of the earlier content is removed: it can never be read again.
  assert os.listdir(os.path.join(cache, 'vit_jax_index')) == [
      os.path.basename(data_lib.get_info(f'folder:{root}', cache).release.splits[
          'train'].index.directory)]


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
  assert not (tmp_path / 'cache' / 'vit_jax_index').exists() or not os.listdir(
      tmp_path / 'cache' / 'vit_jax_index')  # nothing was kept for a rejected folder


@pytest.mark.slow
def test_train_stream_resumes_exactly_and_processes_share_the_split(images, tmp_path):
  root, _ = images
  cache = str(tmp_path / 'cache')
  kwargs = dict(dataset=f'folder:{root}', split='train', data_dir=cache, batch_size=4,
                spec=specs.train_spec('resize|flip', 16), seed=3, shuffle_buffer=100)
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
                                        batch_size=8, spec=PP, process_index=index,
                                        process_count=2)
    masks = np.concatenate([b['mask'] for b in batches])
    assert n == 3 and len(masks) == 24  # both processes yield the same number of batches
    counts.append(int(masks.sum()))
  assert counts == [17, 16]  # the 33 train images, each read by one process


def test_a_folder_name_too_long_for_a_file_name_beside_it_is_read(tmp_path):
  """The index's directory is named after the folder, cut to fit: a 245-character folder name
  (the longest a file system allows, with its suffix) is indexed and read."""
  root = tmp_path / ('a' * 245)
  files = write_colour_folder(root, per_class=2)
  info = data_lib.get_info(f'folder:{root}', str(tmp_path / 'data'))
  assert sum(info.split_sizes.values()) == len(files) == 6


def test_links_in_a_folder_follow_the_releases_rules(tmp_path, capfd):
  """A link loop is not followed, a second name of a file is read once and named, and one file
  in two classes is refused (its label would be ambiguous)."""
  root = tmp_path / 'links'
  files = write_colour_folder(root, per_class=4)
  os.symlink('.', root / 'red' / 'again')
  os.symlink('0.jpg', root / 'red' / 'zero.jpg')
  info = data_lib.get_info(f'folder:{root}', str(tmp_path / 'data'))
  assert sum(info.split_sizes.values()) == len(files) == 12
  assert info.skipped['unreadable'] == ('red/again',)
  assert info.skipped['duplicate'] == ('red/zero.jpg (same file as red/0.jpg)',)
  assert ('; skipped 1 corrupt file (red/broken.jpg) and 2 non-image files (green/anim.gif, '
          'notes.txt) and 1 unreadable entry (red/again) and 1 duplicate file (red/zero.jpg (same '
          'file as red/0.jpg))') in capfd.readouterr().err
  os.symlink('../red/1.png', root / 'blue' / 'stolen.png')
  with pytest.raises(UserError, match=r'red/1.png and .*blue/stolen.png are the same file \(a '
                                      r'link\) in two classes'):
    data_lib.get_info(f'folder:{root}', str(tmp_path / 'data'))


def test_the_few_shot_pool_of_a_folder_is_read_in_place(images, tmp_path):
  """Few-shot evaluation reads a folder as training does (through its index, no copy): the first
  2 records of each class in read order, their images decoded (the colour's channel brightest)."""
  from vit_jax.data import pipeline, specs  # pylint: disable=g-import-not-at-top  # TensorFlow
  from vit_jax.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  root, _ = images
  info = data_lib.get_info(f'folder:{root}', str(tmp_path / 'cache'))
  records, read = pipeline.split_records(info, 'train', cache=False)
  assert read is not None  # (record key, label) records whose images `read` reads
  labels = np.array([int(label) for _, label in records.as_numpy_iterator()])
  pool = fewshot._pool_records(records, 2, info.num_classes)  # pylint: disable=protected-access
  (batch,) = pipeline.padded_eval_batches(
      pool, count=6, num_batches=1, batch_size=8, stored_shape=info.image_shape, read=read,
      spec=PP)
  np.testing.assert_array_equal(batch['label'][:6], labels[fewshot.first_per_class(labels, 2)])
  np.testing.assert_array_equal(batch['mask'], [1] * 6 + [0] * 2)
  channel = {'red': 0, 'green': 1, 'blue': 2}
  brightest = batch['image'][:6].mean(axis=(1, 2)).argmax(-1)
  np.testing.assert_array_equal(brightest, [channel[COLOURS[c]] for c in batch['label'][:6]])


LIBJPEG_LINE = 'Corrupt JPEG data: 2 extraneous bytes before marker 0xc4'


@pytest.mark.slow
def test_an_image_that_makes_libjpeg_print_is_read_through_its_quiet_stand_in(tmp_path, capfd):
  """A JPEG that decodes while libjpeg prints a line on fd 2 at every decode: indexing finds it,
  the streams read a PNG of the same pixels in its place, and stderr holds no libjpeg line
  through indexing, train batches across epochs and two eval passes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess, releases  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'noisy'
  write_colour_folder(root, per_class=3)
  write_noisy_jpeg(root / 'red' / 'noisy.jpg', 'red')
  with open(root / 'red' / 'noisy.jpg', 'rb') as f:
    raw = f.read()
  # And one that does not decode: its Huffman table's code counts overflow.
  bogus = bytearray(raw)
  table = raw.index(b'\xff\xc4') + 5
  bogus[table:table + 16] = b'\xff' * 16
  with open(root / 'green' / 'bogus.jpg', 'wb') as f:
    f.write(bogus)
  capfd.readouterr()
  want = preprocess.decode(tf.constant(raw), 3).numpy()
  with pytest.raises(tf.errors.InvalidArgumentError):
    preprocess.decode(tf.constant(bytes(bogus)), 3)
  err = capfd.readouterr().err  # the files do make libjpeg print
  assert LIBJPEG_LINE in err and 'Bogus Huffman table definition' in err, err

  dataset, cache = f'folder:{root}', str(tmp_path / 'cache')
  info = data_lib.get_info(dataset, cache)
  split = info.release.splits['train']
  (row,) = [r for r in split.rows if split.index.name(r) == 'red/noisy.jpg']
  assert list(split.stand_ins) == [row] and info.skipped['corrupt'] == ('green/bogus.jpg',
                                                                        'red/broken.jpg')
  key = [k for k in releases.records(info.release, 'train')[0] if releases.key_rows(k) == row]
  (read,) = releases.read(info.release, np.asarray(key))
  assert read != raw and read.startswith(b'\x89PNG')
  np.testing.assert_array_equal(preprocess.decode(tf.constant(read), 3).numpy(), want)

  stream = data_lib.train_iterator(dataset=dataset, split='train', data_dir=cache, batch_size=4,
                                   spec=specs.train_spec('resize', 16), seed=0, shuffle_buffer=1)
  labels = np.concatenate([next(stream)['label'] for _ in range(6)])  # 24 > 7 train images
  assert len(labels) == 24
  for _ in range(2):
    batches, _ = data_lib.eval_iterator(dataset=dataset, split='train+test', data_dir=cache,
                                        batch_size=8, spec=PP)
    assert sum(int(b['mask'].sum()) for b in batches) == 10
  # The index reused: the stand-in is read again, nothing decoded at load.
  assert data_lib.get_info(dataset, cache).release.splits['train'].stand_ins == split.stand_ins
  err = capfd.readouterr().err
  assert 'Corrupt JPEG' not in err and 'Huffman' not in err, err

  # A stand-in damaged or removed since it was made is passed over: the image itself is read.
  png = split.stand_ins[row].path
  damaged = bytearray(read)
  damaged[len(damaged) // 2] ^= 0xff
  with open(png, 'wb') as f:
    f.write(damaged)
  assert releases.read(info.release, np.asarray(key)) == [raw]
  os.remove(png)
  assert releases.read(info.release, np.asarray(key)) == [raw]
