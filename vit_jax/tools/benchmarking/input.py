"""Input throughput per host core: the pre-training preprocessing (decode, Inception crop, flip)
on the same synthetic JPEGs read in place from an archive (a tar of per-class tars, read as
`imagenet21k`: vit_jax/data/releases.py) and from a folder of class folders (`folder:`, one file
per image: vit_jax/data/folder.py).

`python -m vit_jax bench --mode=input --input_data=archive` writes the images once under
--data_dir (sizes drawn from typical ImageNet shapes), then times each source's train stream after
one full epoch of warm-up (the page cache then holds both) and reports img/s and img/s per usable
core for both, and their ratio.
"""

import io
import os
import tarfile
import time
from typing import Dict

import numpy as np

from vit_jax import data as data_lib
from vit_jax.data import specs
from vit_jax.platform import cpus

# Typical ImageNet image shapes (width, height); the release's mean is about 400 x 350.
SHAPES = ((500, 375), (500, 333), (375, 500), (500, 500), (640, 480), (400, 300), (333, 500))
PP, SIZE = 'inception_crop|flip', 224  # configs/pretrain.py's train preprocessing


def synthetic_release(root: str, count: int = 256, classes: int = 8) -> Dict[str, str]:
  """{'archive': data_dir holding imagenet21k/synthetic_whole.tar, 'folder': the same JPEGs as
  a folder of class folders} under `root` (written once)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  base = os.path.join(root, f'input_release_{count}')
  out = {'archive': os.path.join(base, 'archive'), 'folder': os.path.join(base, 'folder')}
  done = os.path.join(base, '.complete')
  if os.path.exists(done):
    return out
  rng = np.random.default_rng(0)
  per_class: Dict[str, list] = {}
  for i in range(count):
    width, height = SHAPES[i % len(SHAPES)]
    coarse = rng.uniform(0, 255, (height // 16 + 1, width // 16 + 1, 3)).astype(np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
    noise = rng.normal(0, 12, (height, width, 3))
    pixels = np.clip(np.asarray(smooth, np.float32) + noise, 0, 255).astype(np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, 'JPEG', quality=90)
    synset = f'n{i % classes:08d}'
    name = f'{synset}_{i}.JPEG'
    per_class.setdefault(synset, []).append((name, encoded.getvalue()))
    os.makedirs(os.path.join(out['folder'], synset), exist_ok=True)
    with open(os.path.join(out['folder'], synset, name), 'wb') as f:
      f.write(encoded.getvalue())
  os.makedirs(os.path.join(out['archive'], 'imagenet21k'), exist_ok=True)
  with tarfile.open(os.path.join(out['archive'], 'imagenet21k', 'synthetic_whole.tar'), 'w') as tar:
    for synset, files in sorted(per_class.items()):
      _add(tar, f'{synset}.tar', _tar(files))
  open(done, 'w').close()
  return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  member = tarfile.TarInfo(name)
  member.size = len(data)
  tar.addfile(member, io.BytesIO(data))


def _tar(files) -> bytes:
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode='w') as tar:
    for name, data in files:
      _add(tar, name, data)
  return out.getvalue()


def stream_rate(dataset: str, split: str, data_dir: str, batch_size: int, count: int,
                batches: int) -> float:
  """img/s of the train stream of `dataset` after a warm-up of one epoch (`count` images)."""
  it = data_lib.train_iterator(dataset=dataset, split=split, data_dir=data_dir,
                               batch_size=batch_size, spec=specs.train_spec(PP, SIZE), seed=0, shuffle_buffer=count,
                               cache=True)
  for _ in range(-(-count // batch_size) + 1):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * batch_size / (time.perf_counter() - start)


def run(data_dir: str, batch_size: int = 32, batches: int = 16, count: int = 256,
        rounds: int = 2) -> dict:
  """Both sources timed alternately `rounds` times; the best round of each."""
  paths = synthetic_release(data_dir, count)
  sources = {'archive': ('imagenet21k', 'full', paths['archive']),
             'folder': (f'folder:{paths["folder"]}', 'train+test', data_dir)}
  rates = {name: [] for name in sources}
  for _ in range(rounds):
    for name, (dataset, split, where) in sources.items():
      rates[name].append(stream_rate(dataset, split, where, batch_size, count, batches))
  cores = cpus.usable()
  result = {'mode': 'input', 'input_data': 'archive', 'preprocessing': PP,
            'batch_size': batch_size, 'batches': batches, 'images': count, 'cores': cores,
            'processor': cpus.describe()}
  for name, values in rates.items():
    result[f'{name}_img_per_s'] = max(values)
    result[f'{name}_img_per_s_all'] = values
    result[f'{name}_img_per_s_per_core'] = max(values) / cores
  result['archive_vs_folder'] = result['archive_img_per_s'] / result['folder_img_per_s']
  return result


def format_result(r: dict) -> str:
  return '\n'.join([
      f'input pipeline, pre-training preprocessing ({r["preprocessing"]}), batch '
      f'{r["batch_size"]}, {r["images"]} synthetic JPEGs, on {cpus.one_line(r["processor"])}'
      f' ({r["cores"]} usable cores):',
      f'  archive read in place: {r["archive_img_per_s"]:.1f} img/s = '
      f'{r["archive_img_per_s_per_core"]:.1f} img/s per core',
      f'  folder read in place:  {r["folder_img_per_s"]:.1f} img/s = '
      f'{r["folder_img_per_s_per_core"]:.1f} img/s per core',
      f'  archive / folder: {r["archive_vs_folder"]:.2f}'])


__all__ = ['format_result', 'run', 'stream_rate', 'synthetic_release']
