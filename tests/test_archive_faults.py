"""Faults in data read in place (vit_jax/data/archive/), each made for real on a handful of tiny
images in tmp_path: an image changed in place with the same size and last bytes, images added to
a folder nested in a class folder, gzip where a tar is expected."""

import gzip
import io
import os
import shutil
import tarfile

import numpy as np
import pytest
from PIL import Image

from vit_jax import data as data_lib
from vit_jax.data import archive, identity, releases
from vit_jax.data.sources import imagenet
from vit_jax.errors import UserError

SYNSETS = ('n00000001', 'n00000002')
_COMMENT = b'A' * 16  # a JPEG comment: bytes that change nothing of the pixels nor the tail


def jpeg(seed: int, comment: bytes = _COMMENT) -> bytes:
  """A small JPEG with a comment segment right after its start marker."""
  pixels = np.random.default_rng(seed).integers(0, 255, (12, 12, 3), dtype=np.uint8)
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, 'JPEG', quality=70)
  data = out.getvalue()
  return data[:2] + b'\xff\xfe' + (2 + len(comment)).to_bytes(2, 'big') + comment + data[2:]


def tar_bytes(files) -> bytes:
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode='w') as tar:
    for name, data in files:
      member = tarfile.TarInfo(name)
      member.size = len(data)
      tar.addfile(member, io.BytesIO(data))
  return out.getvalue()


def _images(synset: str, n: int = 3):
  return [(f'{synset}_{i}.JPEG', jpeg(100 * int(synset[1:]) + i)) for i in range(n)]


def _write_release(root, layout: str) -> None:
  """imagenet21k under `root` as the whole archive, per-synset tars, or synset folders."""
  os.makedirs(root)
  if layout == 'tar_of_tars':
    whole = tar_bytes([(f'{s}.tar', tar_bytes(_images(s))) for s in SYNSETS])
    with open(os.path.join(root, 'fall11_whole.tar'), 'wb') as f:
      f.write(whole)
  for s in SYNSETS:
    if layout == 'tars':
      with open(os.path.join(root, f'{s}.tar'), 'wb') as f:
        f.write(tar_bytes(_images(s)))
    elif layout == 'folders':
      os.makedirs(os.path.join(root, s))
      for name, data in _images(s):
        with open(os.path.join(root, s, name), 'wb') as f:
          f.write(data)


def _edit_in_place(path: str) -> None:
  """The first image comment in `path` rewritten: the same size, the same last bytes."""
  with open(path, 'r+b') as f:
    data = f.read()
    f.seek(data.index(_COMMENT))
    f.write(b'B' * len(_COMMENT))


def _identify(dataset: str, data_dir: str):
  imagenet._RELEASES.clear()  # as a new process: the data found and indexed again
  return identity.identify(data_lib.get_info(dataset, data_dir))


@pytest.mark.parametrize('layout', ['tar_of_tars', 'tars'])
def test_an_image_changed_in_place_in_a_release_archive_is_other_data(layout, tmp_path):
  data_dir = str(tmp_path / 'data')
  root = os.path.join(data_dir, 'imagenet21k')
  _write_release(root, layout)
  recorded = _identify('imagenet21k', data_dir)
  edited = os.path.join(root, 'fall11_whole.tar' if layout == 'tar_of_tars' else 'n00000002.tar')
  size = os.path.getsize(edited)
  with open(edited, 'rb') as f:
    tail = f.read()[-1024:]
  _edit_in_place(edited)
  with open(edited, 'rb') as f:
    assert os.path.getsize(edited) == size and f.read()[-1024:] == tail
  with pytest.raises(UserError, match='was built from other contents of .*: delete that dir'):
    _identify('imagenet21k', data_dir)
  shutil.rmtree(os.path.join(data_dir, 'vit_jax_index'))  # as the line says
  current = _identify('imagenet21k', data_dir)
  assert current['split_sizes'] == recorded['split_sizes']
  assert identity.changes(recorded, current) == [
      f'the images changed (the same classes and split sizes, other files: content '
      f'{recorded["content"]} -> {current["content"]})']


def test_an_image_changed_in_place_in_a_folder_is_other_data(tmp_path):
  root = tmp_path / 'images'
  _write_release(str(root), 'folders')
  dataset, data_dir = f'folder:{root}', str(tmp_path / 'tfds')
  recorded = _identify(dataset, data_dir)
  edited = root / 'n00000001' / 'n00000001_0.JPEG'
  size = edited.stat().st_size
  _edit_in_place(str(edited))
  assert edited.stat().st_size == size
  current = _identify(dataset, data_dir)
  assert current['content'] != recorded['content']
  assert identity.changes(recorded, current)[0].startswith('the images changed')


def test_an_image_rewritten_in_a_synset_folder_stops_its_read_with_one_line(tmp_path):
  data_dir = str(tmp_path / 'data')
  root = os.path.join(data_dir, 'imagenet21k')
  _write_release(root, 'folders')
  release = releases.find('imagenet21k', data_dir)
  edited = os.path.join(root, 'n00000001', 'n00000001_0.JPEG')
  os.utime(edited, ns=(0, 10**18))  # as rewritten in place: the same size, another time
  index = release.splits['full'].index
  row = next(r for r in range(len(index)) if index.name(r) == 'n00000001/n00000001_0.JPEG')
  with pytest.raises(archive.ReadError, match=rf'^{edited} changed since it was indexed '
                                              r'\(reading n00000001/n00000001_0.JPEG\): '
                                              r'rewritten \(modified '):
    index.read(row)


def test_a_checksum_recorded_otherwise_is_checked_on_names_and_sizes(tmp_path):
  data_dir = str(tmp_path / 'data')
  _write_release(os.path.join(data_dir, 'imagenet21k'), 'tars')
  current = _identify('imagenet21k', data_dir)
  assert current['checksum'] == archive.CHECKSUM
  older = {k: v for k, v in current.items() if k != 'checksum'}  # its digest saw the tails
  assert identity.changes(dict(older, content='0' * 16, fingerprint='1' * 16), current) == []
  other_sizes = dict(older, split_sizes={'full': 5}, fingerprint='1' * 16)
  assert identity.changes(other_sizes, current) == ['full split 5 -> 6 images']


def test_images_added_to_a_folder_inside_a_synset_folder_are_seen(tmp_path):
  data_dir = str(tmp_path / 'data')
  root = os.path.join(data_dir, 'imagenet21k')
  _write_release(root, 'folders')
  extra = os.path.join(root, 'n00000001', 'extra')
  os.makedirs(extra)
  for name, data in _images('n00000007', 2):
    with open(os.path.join(extra, name), 'wb') as f:
      f.write(data)
  release = releases.find('imagenet21k', data_dir)
  names = {release.splits['full'].index.name(r) for r in range(8)}
  assert 'n00000001/extra/n00000007_0.JPEG' in names  # read, in its synset
  assert release.split_sizes == {'full': 8}
  with open(os.path.join(extra, 'n00000007_9.JPEG'), 'wb') as f:
    f.write(jpeg(9))
  with pytest.raises(UserError, match=r'^the index in .* was built from other contents of '
                                      rf'{root} \(1 changed: n00000001/extra\): delete that '
                                      r'directory to index the source again$'):
    releases.find('imagenet21k', data_dir)


def test_images_added_to_a_nested_folder_of_a_folder_dataset_are_read(tmp_path):
  root = tmp_path / 'images'
  _write_release(str(root), 'folders')
  extra = root / 'n00000001' / 'extra' / 'deeper'
  extra.mkdir(parents=True)
  data_dir = str(tmp_path / 'tfds')
  before = data_lib.get_info(f'folder:{root}', data_dir).split_sizes
  (extra / 'late.JPEG').write_bytes(jpeg(7))
  imagenet._RELEASES.clear()
  after = data_lib.get_info(f'folder:{root}', data_dir).split_sizes
  assert sum(after.values()) == sum(before.values()) + 1


@pytest.mark.parametrize('where', ['whole', 'synset_tar', 'member_of_whole'])
def test_gzip_where_a_tar_is_expected_is_named_as_gzip(where, tmp_path):
  data_dir = str(tmp_path / 'data')
  root = os.path.join(data_dir, 'imagenet21k')
  os.makedirs(root)
  tars = {s: tar_bytes(_images(s)) for s in SYNSETS}
  if where == 'whole':
    path = os.path.join(root, 'fall11_whole.tar')
    with open(path, 'wb') as f:
      f.write(gzip.compress(tar_bytes([(f'{s}.tar', t) for s, t in tars.items()])))
    fix = rf'decompress it \(mv {path} {path}.gz && gunzip {path}.gz\), then rerun$'
    shown = path
  elif where == 'synset_tar':
    for s, t in tars.items():
      with open(os.path.join(root, f'{s}.tar'), 'wb') as f:
        f.write(gzip.compress(t) if s == 'n00000002' else t)
    path = os.path.join(root, 'n00000002.tar')
    fix = rf'decompress it \(mv {path} {path}.gz && gunzip {path}.gz\), then rerun$'
    shown = path
  else:
    path = os.path.join(root, 'fall11_whole.tar')
    with open(path, 'wb') as f:
      f.write(tar_bytes([(f'{s}.tar', gzip.compress(t) if s == 'n00000002' else t)
                         for s, t in tars.items()]))
    fix = 'decompress it before packing it into the archive, or unpack the archive, then rerun$'
    shown = f'{path}:n00000002.tar'
  with pytest.raises(UserError, match=rf'^{shown} is gzip-compressed \(it starts with the gzip '
                                      rf'bytes 1f 8b\), not a plain tar: images are read in '
                                      rf'place from an uncompressed tar; {fix}'):
    releases.find('imagenet21k', data_dir)


def test_a_synset_tar_appended_to_the_whole_archive_is_named_as_such(tmp_path, capfd):
  data_dir = str(tmp_path / 'data')
  root = os.path.join(data_dir, 'imagenet21k')
  _write_release(root, 'tar_of_tars')
  path = os.path.join(root, 'fall11_whole.tar')
  with tarfile.open(path, 'a') as whole:  # as `tar -rf fall11_whole.tar n00000001.tar` does
    data = tar_bytes(_images('n00000001', 4))
    member = tarfile.TarInfo('n00000001.tar')
    member.size = len(data)
    whole.addfile(member, io.BytesIO(data))
  capfd.readouterr()
  release = releases.find('imagenet21k', data_dir)
  assert release.split_sizes == {'full': 7}  # the last copy, as `tar -x` leaves it
  notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith('note:')]
  assert notes == [f'note: {path}: 1 synset tar stored twice in the archive (appended) (the '
                   f'last copy read): n00000001.tar']


def test_the_indexing_eta_is_left_out_until_it_means_something(monkeypatch, capsys):
  from vit_jax.data.archive import building  # pylint: disable=g-import-not-at-top
  now = [0.0]
  monkeypatch.setattr(building.time, 'monotonic', lambda: now[0])
  progress = building._Progress('fall11_whole.tar', 100, 0)
  now[0] = 6.0
  for _ in range(9):  # 9 units done in the first 6 s, together, as workers start
    progress.step()
  now[0] = 20.0
  progress.step()  # 10 of 100 in 20 s: 90 more take 180 s
  assert capsys.readouterr().err.splitlines() == [
      'indexing fall11_whole.tar: 1/100 units, 0:00:06 elapsed',
      'indexing fall11_whole.tar: 10/100 units, 0:00:20 elapsed, ETA 0:03:00']


def test_a_folder_index_without_a_data_dir_is_in_the_user_cache_and_one_per_folder(
    tmp_path, monkeypatch):
  monkeypatch.delenv(archive.DIR_VAR, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  root = tmp_path / 'images'
  _write_release(str(root), 'folders')
  base = tmp_path / 'cache' / 'vit_jax' / 'index'
  first = data_lib.get_info(f'folder:{root}', None).release.splits['train'].index.directory
  assert os.path.dirname(first) == str(base)
  (root / 'n00000002' / 'late.JPEG').write_bytes(jpeg(8))  # another content: another index
  imagenet._RELEASES.clear()
  second = data_lib.get_info(f'folder:{root}', None).release.splits['train'].index.directory
  assert second != first and os.listdir(base) == [os.path.basename(second)]
  assert not (tmp_path / 'home' / 'tensorflow_datasets').exists()


def test_an_index_of_the_earlier_format_is_built_again(tmp_path):
  root = str(tmp_path / 'imagenet21k')
  _write_release(root, 'tars')
  base = str(tmp_path / 'index')
  directory, built = archive.build(root, 'tars', base)
  content = archive.load(root, 'tars', base).content
  meta_path = os.path.join(directory, 'meta.json')
  meta = archive.read_json(meta_path)
  archive.write_json(meta_path, dict(meta, format=archive.FORMAT - 1))  # as an older vit_jax wrote
  with open(os.path.join(directory, 'parts', '0000000.npz'), 'wb') as f:
    f.write(b'a part of the older format')  # never read: the index is built again
  index = archive.load(root, 'tars', base)
  assert built and index.built and index.content == content and len(index) == 6
  assert archive.read_json(meta_path)['format'] == archive.FORMAT
