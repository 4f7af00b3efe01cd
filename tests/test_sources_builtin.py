"""The built-in data sources by name (embedded, folder, the ImageNet releases, tfds): each name
resolves to its source module, and each source's identity (recorded with every checkpoint) is
the one pinned here, so checkpoints recorded before keep matching their data."""

import json
import os

import numpy as np
from PIL import Image

from vit_jax import data as data_lib
from vit_jax.data import identity


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
