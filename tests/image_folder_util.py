"""A small image folder for tests: colour classes that a tiny ViT learns in a few steps."""

import os

import numpy as np
from PIL import Image

COLOURS = ('blue', 'green', 'red')  # sorted: label i = COLOURS[i]
_CHANNEL = {'red': 0, 'green': 1, 'blue': 2}


def colour_image(colour: str, rng: np.random.Generator, size=None) -> np.ndarray:
  """uint8 [H, W, 3]: noise in [0, 100) plus 155 in the colour's channel."""
  h, w = size if size is not None else rng.integers(20, 40, 2)
  image = rng.integers(0, 100, (h, w, 3))
  image[..., _CHANNEL[colour]] += 155
  return image.astype(np.uint8)


def write_colour_folder(root, per_class: int = 12, seed: int = 0) -> dict:
  """root/<colour>/<i>.png|.jpg, plus root/red/broken.jpg (corrupt), root/notes.txt and
  root/green/anim.gif (non-images) and a hidden file. Returns {relative path: label}."""
  rng = np.random.default_rng(seed)
  files = {}
  for label, colour in enumerate(COLOURS):
    os.makedirs(os.path.join(root, colour), exist_ok=True)
    for i in range(per_class):
      rel = f'{colour}/{i}.{"png" if i % 2 else "jpg"}'
      Image.fromarray(colour_image(colour, rng)).save(os.path.join(root, rel))
      files[rel] = label
  with open(os.path.join(root, 'red', 'broken.jpg'), 'wb') as f:
    f.write(b'\xff\xd8\xff\xe0 this is not a JPEG')
  with open(os.path.join(root, 'notes.txt'), 'w') as f:
    f.write('not an image')
  Image.fromarray(colour_image('green', rng)).save(os.path.join(root, 'green', 'anim.gif'))
  with open(os.path.join(root, 'blue', '.DS_Store'), 'wb') as f:
    f.write(b'\x00\x01')
  return files


def image_paths(directory) -> dict:
  """{path: colour} of the images `write_images` writes to `directory`."""
  return {os.path.join(directory, f'{c}.{"jpg" if c == "red" else "png"}'): c for c in COLOURS}


def write_images(directory, seed: int = 1) -> dict:
  """One new image per colour (new sizes and noise): {path: colour}."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  paths = image_paths(directory)
  for path, colour in paths.items():
    Image.fromarray(colour_image(colour, rng, size=(33, 27))).save(path)
  return paths


def write_noisy_jpeg(path, colour: str, seed: int = 2) -> None:
  """A JPEG that decodes while libjpeg prints "Corrupt JPEG data: 2 extraneous bytes before
  marker 0xc4": a valid one with two bytes put before its first Huffman table marker."""
  import io  # pylint: disable=g-import-not-at-top
  out = io.BytesIO()
  Image.fromarray(colour_image(colour, np.random.default_rng(seed), (32, 32))).save(out, 'JPEG')
  data = out.getvalue()
  marker = data.index(b'\xff\xc4')
  with open(path, 'wb') as f:
    f.write(data[:marker] + b'\x00\x00' + data[marker:])
