"""The built-in data sources by name (embedded, folder, the ImageNet releases, tfds): each name
resolves to its source module, and each source's identity (recorded with every checkpoint) is
the one pinned here, so checkpoints recorded before keep matching their data."""

import json
import os

import numpy as np
from PIL import Image
import pytest

from vit_jax import data as data_lib
from vit_jax.data import identity, sources
from vit_jax.data.sources import embedded, in_place
from vit_jax.errors import UserError


def _write_folder(root) -> None:
  """root/{a,b}/<i>.png: 3 images per class of fixed pixels (PNG is lossless and its encoding
  fixed, so the files' bytes, and the content digest, are the same at every run)."""
  for label, name in enumerate(('a', 'b')):
    os.makedirs(os.path.join(root, name))
    for i in range(3):
      pixels = np.full((4 + i, 5, 3), 40 * i + 100 * label, np.uint8)
      Image.fromarray(pixels).save(os.path.join(root, name, f'{i}.png'))


def test_the_identity_of_an_embedded_dataset_is_none():
  """mnist5k and digits ship inside installed packages: nothing to notice changing."""
  assert identity.identify(data_lib.get_info('mnist5k', None)) is None
  assert identity.identify(data_lib.get_info('digits', None)) is None


def test_the_identity_of_a_folder_is_pinned(tmp_path):
  root = tmp_path / 'pinned'
  _write_folder(str(root))
  info = data_lib.get_info(f'folder:{root}', str(tmp_path / 'index'))
  # The dict as recorded, its key order included (checkpoints keep it as JSON).
  assert json.dumps(identity.identify(info)) == json.dumps({
      'class_names': ['a', 'b'], 'split_sizes': {'test': 2, 'train': 4},
      'content': '22f16ea945d02201', 'checksum': 'crc32', 'fingerprint': '3c9b2ad1efb65c0b'})


def test_each_built_in_name_is_served_by_its_source_module(tmp_path):
  root = tmp_path / 'pinned'
  _write_folder(str(root))
  served = {name: type(data_lib.get_info(name, str(tmp_path / 'index')).source)
            for name in ('mnist5k', 'digits', f'folder:{root}')}
  assert served == {'mnist5k': embedded.Embedded, 'digits': embedded.Embedded,
                    f'folder:{root}': in_place.InPlace}
  # imagenet2012 without its archives (nor a tfds copy) goes on to tfds, which says how to fix it.
  with pytest.raises(UserError, match=r"^dataset 'imagenet2012' is not prepared: .* or put "
                                      r"ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar"):
    data_lib.get_info('imagenet2012', str(tmp_path))
  with pytest.raises(UserError, match=r"^dataset 'cifar10' is not prepared"):
    data_lib.get_info('cifar10', str(tmp_path))


def test_a_registered_prefix_comes_first_and_a_source_that_declines_falls_through():
  sources.register('mnist', lambda dataset, data_dir: None)  # serves no name it sees
  try:
    assert isinstance(data_lib.get_info('mnist5k', None).source, embedded.Embedded)
  finally:
    sources.unregister('mnist')
  sources.register('digits', lambda dataset, data_dir: embedded.load('mnist5k', data_dir))
  try:
    assert data_lib.get_info('digits', None).num_classes == 10
    assert data_lib.get_info('digits', None).image_shape == (28, 28, 1)  # mnist5k's
  finally:
    sources.unregister('digits')
  assert data_lib.get_info('digits', None).image_shape == (8, 8, 1)
