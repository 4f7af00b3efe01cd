"""The ImageNet robustness sets read in place from fake releases in their real names and
layouts (a few tiny images each), scored over their own classes against scores worked out by
hand; bad layouts and missing mapping files are one line naming the file and the fix."""

import dataclasses
import json
import os
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from test_archive import jpeg, tar_bytes, zip_bytes
from vit_jax import data
from vit_jax.data.sources import imagenet_subsets, robustness
from vit_jax.data import specs
from vit_jax.errors import UserError
from vit_jax.evaluate import robustness as scoring

WNIDS = robustness.imagenet_wnids()
INDEX = {w: i for i, w in enumerate(WNIDS)}
PP = specs.eval_spec('resize', 16)


def _write(path, blob: bytes):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(blob)


def _labels(info):
  """The labels of the 'test' split in read order."""
  from vit_jax.data import releases  # pylint: disable=g-import-not-at-top
  return releases.records(info.release, 'test')[1].tolist()


def _hits(logits, labels, mask, to_set):
  sums = scoring.hits(logits, labels, mask, to_set)
  return int(sums['correct']), int(sums['count'])


def test_imagenet_r_from_its_tar_in_place_scored_over_its_200_classes(tmp_path):
  """imagenet-r.tar as downloaded (imagenet-r/<wnid>/<file>.jpg, and its README), indexed and
  read in place; the logit of a class outside the 200 is left out before the argmax."""
  r = imagenet_subsets.IMAGENET_R
  assert len(r) == len(set(r)) == 200 and set(r) <= set(WNIDS)
  files = [(f'imagenet-r/{w}/art_{k}.jpg', jpeg(10 * i + k)) for i, w in enumerate(r[:3])
           for k in range(2)] + [('imagenet-r/README.txt', b'ImageNet-R')]
  _write(str(tmp_path / 'imagenet-r.tar'), tar_bytes(files))
  info = data.get_info('imagenet_r', str(tmp_path))
  assert (info.num_examples('test'), info.num_classes) == (6, 1000)
  assert _labels(info) == [INDEX[r[0]]] * 2 + [INDEX[r[1]]] * 2 + [INDEX[r[2]]] * 2
  assert not os.path.exists(tmp_path / 'imagenet-r')  # nothing unpacked or copied

  batches, n = data.eval_iterator(dataset='imagenet_r', split='test', data_dir=str(tmp_path),
                                  batch_size=4, spec=PP)
  got = list(batches)
  assert n == 2 and sum(float(b['mask'].sum()) for b in got) == 6
  assert got[0]['image'].shape == (4, 16, 16, 3)

  # By hand: row 0's top logit is goldfish's neighbour tench (n01440764, not in ImageNet-R), so
  # over the 200 classes its argmax is its label; row 1 picks another ImageNet-R class (wrong);
  # row 2 is right outright.
  labels = np.asarray([INDEX[r[0]], INDEX[r[0]], INDEX[r[1]]])
  logits = np.zeros([3, 1000])
  logits[0, INDEX['n01440764']], logits[0, INDEX[r[0]]] = 9.0, 5.0
  logits[1, INDEX[r[5]]], logits[1, INDEX[r[0]]] = 7.0, 6.0
  logits[2, INDEX[r[1]]] = 1.0
  to_set = info.source.scoring.to_set
  assert _hits(logits, labels, [1, 1, 1], to_set) == (2, 3)
  assert _hits(logits, labels, [1, 1, 0], to_set) == (1, 2)  # padding counts for nothing
  # Over all 1,000 classes row 0 would be wrong.
  assert _hits(logits, labels, [1, 1, 1], robustness.identity_scoring().to_set) == (1, 3)
  jax_sums = scoring.hits(jnp.asarray(logits, jnp.float32), labels, np.ones(3), to_set, xp=jnp)
  assert (float(jax_sums['correct']), float(jax_sums['count'])) == (2.0, 3.0)


def test_imagenet_a_and_sketch_from_their_folders(tmp_path):
  a = imagenet_subsets.IMAGENET_A
  for k, w in enumerate(a[:2]):
    _write(str(tmp_path / 'imagenet-a' / w / f'0.{k}.jpg'), jpeg(k))
  _write(str(tmp_path / 'imagenet-a' / 'README.txt'), b'ImageNet-A')
  info = data.get_info('imagenet_a', str(tmp_path))
  assert _labels(info) == [INDEX[a[0]], INDEX[a[1]]]
  assert int((info.source.scoring.to_set >= 0).sum()) == 200
  for k, w in enumerate(('n01440764', 'n15075141')):
    _write(str(tmp_path / 'sketch' / w / f'sketch_{k}.JPEG'), jpeg(k))
  info = data.get_info('imagenet_sketch', str(tmp_path))
  assert _labels(info) == [0, 999]
  assert int((info.source.scoring.to_set >= 0).sum()) == 1000


def test_imagenet_sketch_read_in_place_from_its_zip_as_from_its_folder(tmp_path):
  """ImageNet-Sketch.zip as downloaded (sketch/<wnid>/<file>.JPEG, some members deflated, some
  stored): the records, labels and image bytes of the unpacked sketch/ folder, nothing unpacked;
  an encrypted member is one line."""
  wnids = ('n01440764', 'n01443537', 'n15075141')
  images = {f'sketch/{w}/sketch_{k}.JPEG': jpeg(10 * i + k) for i, w in enumerate(wnids)
            for k in range(2)}
  methods = (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED)
  zipped = tmp_path / 'zipped'
  _write(str(zipped / 'ImageNet-Sketch.zip'),
         zip_bytes([(n, b, methods[k % 2]) for k, (n, b) in enumerate(images.items())]))
  info = data.get_info('imagenet_sketch', str(zipped))
  assert sorted(os.listdir(zipped)) == ['ImageNet-Sketch.zip', 'vit_jax_index']  # in place
  assert info.source.release.splits['test'].index.layout == 'flat_zip'
  unpacked = tmp_path / 'unpacked'
  for name, blob in images.items():
    _write(str(unpacked / name), blob)
  folder_info = data.get_info('imagenet_sketch', str(unpacked))
  assert info.num_examples('test') == folder_info.num_examples('test') == 6
  assert _labels(info) == _labels(folder_info) == [0, 0, 1, 1, 999, 999]
  from vit_jax.data import releases  # pylint: disable=g-import-not-at-top
  read = lambda i: releases.read(i.release, releases.records(i.release, 'test')[0])
  assert read(info) == read(folder_info) == list(images.values())

  # Scored over all 1,000 classes, by hand: rows 0 and 2 right, row 1 wrong.
  batches, n = data.eval_iterator(dataset='imagenet_sketch', split='test', data_dir=str(zipped),
                                  batch_size=4, spec=PP)
  assert n == 2 and sum(float(b['mask'].sum()) for b in batches) == 6
  logits = np.zeros([3, 1000])
  logits[0, 0], logits[1, 5], logits[2, 999] = 1.0, 1.0, 1.0
  assert _hits(logits, np.asarray([0, 1, 999]), [1, 1, 1], info.source.scoring.to_set) == (2, 3)

  blob = bytearray(zip_bytes([(n, b, zipfile.ZIP_STORED) for n, b in images.items()]))
  blob[blob.find(b'PK\x01\x02') + 8] |= 1  # the first member flagged encrypted, as ZipCrypto's
  locked = tmp_path / 'locked'
  _write(str(locked / 'ImageNet-Sketch.zip'), bytes(blob))
  with pytest.raises(UserError, match=r'^\S+/ImageNet-Sketch.zip: its member sketch/n01440764/'
                                      r'sketch_0.JPEG is encrypted, .* \(`unzip '
                                      r'ImageNet-Sketch.zip` in \S+\) and read the folder'):
    data.get_info('imagenet_sketch', str(locked))


def test_imagenet_v2_variants_from_class_index_folders_and_a_decompressed_tar(tmp_path):
  for cls in (0, 7, 999):
    _write(str(tmp_path / 'imagenetv2-matched-frequency-format-val' / str(cls) / f'{cls}a.jpeg'),
           jpeg(cls))
  info = data.get_info('imagenet_v2/matched-frequency', str(tmp_path))
  assert sorted(_labels(info)) == [0, 7, 999]
  assert _labels(data.get_info('imagenet_v2', str(tmp_path))) == _labels(info)
  files = [(f'imagenetv2-top-images-format-val/{c}/x{c}.jpeg', jpeg(c)) for c in (3, 4)]
  _write(str(tmp_path / 'imagenetv2-top-images.tar'), tar_bytes(files))
  assert sorted(_labels(data.get_info('imagenet_v2/topimages', str(tmp_path)))) == [3, 4]


def _objectnet(root, *, drop=None):
  """A fake objectnet-1.0/: 3 folders (two of ObjectNet's ImageNet-overlapping classes and one
  that is not), and its four mapping files over a shortened ImageNet label list."""
  base = os.path.join(root, 'objectnet-1.0')
  for folder, count in (('alarm_clock', 2), ('banana', 1), ('air_freshener', 1)):
    for k in range(count):
      _write(os.path.join(base, 'images', folder, f'{k:04x}.png'), jpeg(k))
  # ImageNet label text per line, and line per ImageNet (sorted WordNet id) index.
  lines = ['banana', 'analog clock', 'digital clock', 'tench']
  line_of = {str(INDEX['n07753592']): 0, str(INDEX['n02708093']): 1,
             str(INDEX['n03196217']): 2, str(INDEX['n01440764']): 3}
  files = {
      'folder_to_objectnet_label.json': json.dumps({'alarm_clock': 'Alarm clock',
                                                    'banana': 'Banana',
                                                    'air_freshener': 'Air freshener'}),
      'objectnet_to_imagenet_1k.json': json.dumps({'Alarm clock': 'analog clock; digital clock',
                                                   'Banana': 'banana'}),
      'imagenet_to_label_2012_v2': '\n'.join(lines) + '\n',
      'pytorch_to_imagenet_2012_id.json': json.dumps(line_of),
  }
  for name, text in files.items():
    if name != drop:
      _write(os.path.join(base, 'mappings', name), text.encode())


def test_objectnet_scored_over_its_overlapping_classes_through_its_mappings(tmp_path):
  _objectnet(str(tmp_path))
  info = data.get_info('objectnet', str(tmp_path))
  # Classes: the overlapping ones, sorted ('Alarm clock' 0, 'Banana' 1); Air freshener left out.
  assert info.class_names == ('Alarm clock', 'Banana') and _labels(info) == [0, 0, 1]
  to_set = info.source.scoring.to_set
  assert {i: int(to_set[i]) for i in np.flatnonzero(to_set >= 0)} == {
      INDEX['n02708093']: 0, INDEX['n03196217']: 0, INDEX['n07753592']: 1}
  # By hand: row 0 picks digital clock (-> Alarm clock: right, though not the clock it is),
  # row 1's top logit is tench (outside ObjectNet's classes, left out) then banana (wrong), row
  # 2 picks banana (right): 2 of 3.
  logits = np.zeros([3, 1000])
  logits[0, INDEX['n03196217']] = 3.0
  logits[1, INDEX['n01440764']], logits[1, INDEX['n07753592']] = 8.0, 2.0
  logits[2, INDEX['n07753592']] = 4.0
  assert _hits(logits, [0, 0, 1], [1, 1, 1], to_set) == (2, 3)


@pytest.mark.parametrize('missing', robustness.OBJECTNET_MAPPINGS)
def test_a_missing_objectnet_mapping_file_is_one_line_naming_it(tmp_path, missing):
  _objectnet(str(tmp_path), drop=missing)
  with pytest.raises(UserError, match=rf"^ObjectNet's mapping file \S+/objectnet-1.0/mappings/"
                                      rf"{missing} is missing: put the mappings/ folder"):
    data.get_info('objectnet', str(tmp_path))


def test_archives_that_cannot_be_read_in_place_and_bad_layouts_are_one_line(tmp_path):
  _write(str(tmp_path / 'objectnet-1.0.zip'), b'PK')
  with pytest.raises(UserError, match=r'objectnet-1.0.zip cannot be read in place: unpack it once '
                                      r'in \S+ \(`unzip objectnet-1.0.zip'):
    data.get_info('objectnet', str(tmp_path))
  _write(str(tmp_path / 'imagenetv2-threshold0.7.tar.gz'), b'\x1f\x8b')
  with pytest.raises(UserError, match=r'`gunzip imagenetv2-threshold0.7.tar.gz`\), which gives '
                                      r'imagenetv2-threshold0.7.tar$'):
    data.get_info('imagenet_v2/threshold-0.7', str(tmp_path))
  _write(str(tmp_path / 'imagenet-r' / 'goldfish' / 'a.jpg'), jpeg(0))
  with pytest.raises(UserError, match=r'imagenet-r: goldfish is none of the ImageNet WordNet ids'):
    data.get_info('imagenet_r', str(tmp_path))
  # Not released here: the name is tfds's, which says it is not prepared.
  with pytest.raises(UserError, match=r"dataset 'imagenet_a' is not prepared"):
    data.get_info('imagenet_a', str(tmp_path))


class _BrightnessModel:
  """1,000 ImageNet logits from an image's brightness (an analytic stand-in for a network):
  bright images score tench (outside ImageNet-R) 9 and ImageNet-R's first class 5; dark ones
  score ImageNet-R's second class 1."""
  num_classes = 1000

  def apply(self, variables, images, train):
    del variables, train
    bright = (jnp.mean(images, axis=(1, 2, 3)) > 0)[:, None]
    r = imagenet_subsets.IMAGENET_R
    one = lambda wnid: jnp.zeros(1000).at[INDEX[wnid]].set(1.0)[None]
    return jnp.where(bright, 9 * one('n01440764') + 5 * one(r[0]), one(r[1]))


def _flat_jpeg(level: int) -> bytes:
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  out = io.BytesIO()
  Image.fromarray(np.full((12, 12, 3), level, np.uint8)).save(out, 'JPEG')
  return out.getvalue()


def test_the_robustness_evaluator_scores_a_set_read_in_place(tmp_path):
  """Two bright images of ImageNet-R's first class (right over its 200 classes, wrong over all
  1,000), a dark one of its second (right) and a dark one of its first (wrong): 3 of 4."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  r = imagenet_subsets.IMAGENET_R
  for name, level in ((f'{r[0]}/a.jpg', 230), (f'{r[0]}/b.jpg', 220), (f'{r[1]}/c.jpg', 20),
                      (f'{r[0]}/d.jpg', 10)):
    _write(str(tmp_path / 'imagenet-r' / name), _flat_jpeg(level))
  mesh = parallel.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1)))
  evaluator = scoring.RobustnessEvaluator(
      model=_BrightnessModel(), mesh=mesh, param_shardings=None, sets=['imagenet_r'],
      data_dir=str(tmp_path), batch_size=8, spec=PP)
  assert evaluator({}) == {'imagenet_r': 0.75}
  assert scoring.set_names('imagenet_r+objectnet') == ('imagenet_r', 'objectnet')
  assert len(scoring.set_names('all')) == 7
  with pytest.raises(ValueError, match="unknown robustness set 'imagenet_c': use all, or names"):
    scoring.set_names('imagenet_r+imagenet_c')


def test_a_set_without_its_release_is_scored_by_its_name(tmp_path, monkeypatch):
  """tfds's copy of a set (a source without `scoring`) is scored as the set's name says: the
  images of the test above, served by a source that hides the release's scoring, score alike."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  r = imagenet_subsets.IMAGENET_R
  for name, level in ((f'{r[0]}/a.jpg', 230), (f'{r[0]}/b.jpg', 220), (f'{r[1]}/c.jpg', 20),
                      (f'{r[0]}/d.jpg', 10)):
    _write(str(tmp_path / 'imagenet-r' / name), _flat_jpeg(level))
  in_place = data.get_info('imagenet_r', str(tmp_path))

  class Unscored:  # the set's facts and records, no scoring (as tfds's imagenet_r)
    def __getattr__(self, name):
      if name == 'scoring':
        raise AttributeError(name)
      return getattr(in_place.source, name)

  monkeypatch.setattr(data, 'get_info', lambda name, data_dir: dataclasses.replace(
      in_place, source=Unscored()))
  mesh = parallel.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1)))
  evaluator = scoring.RobustnessEvaluator(
      model=_BrightnessModel(), mesh=mesh, param_shardings=None, sets=['imagenet_r'],
      data_dir=str(tmp_path), batch_size=8, spec=PP)
  assert evaluator({}) == {'imagenet_r': 0.75}


def test_robustness_sets_are_checked_with_the_config():
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4')
  config.evals.robustness = dict(type='robustness', sets='imagenet_r+imagenet_a')
  registry.check(config)
  config.evals.robustness.sets = 'imagenet_c'
  with pytest.raises(UserError, match=r"^config.evals.robustness.sets='imagenet_c': unknown "
                                      r"robustness set 'imagenet_c'"):
    registry.check(config)


def test_objectnet_images_lose_their_1_pixel_frame_before_evaluation(tmp_path):
  """A gray image in a red 1-pixel frame evaluates as plain gray; ImageNet-A's keep theirs."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  framed = np.full((10, 10, 3), 128, np.uint8)
  framed[0, :], framed[-1, :], framed[:, 0], framed[:, -1] = (255, 0, 0), (255, 0, 0), \
      (255, 0, 0), (255, 0, 0)
  png = io.BytesIO()
  Image.fromarray(framed).save(png, 'PNG')
  _objectnet(str(tmp_path))
  for path in (tmp_path / 'objectnet-1.0' / 'images').glob('*/*.png'):
    path.write_bytes(png.getvalue())
  _write(str(tmp_path / 'imagenet-a' / imagenet_subsets.IMAGENET_A[0] / 'a.png'), png.getvalue())
  spec = specs.eval_spec('resize', 8)
  for name, plain in (('objectnet', True), ('imagenet_a', False)):
    batches, _ = data.eval_iterator(dataset=name, split='test', data_dir=str(tmp_path),
                                    batch_size=4, spec=spec)
    batch = next(iter(batches))
    pixels = np.round(batch['image'][0] * 127.5 + 127.5)
    assert (np.all(pixels == 128) if plain else pixels[0, 0, 0] > 200), name
