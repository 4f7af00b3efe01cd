"""The cost of the content checksum at indexing: the CRC-32 of every byte of every image.

Indexes a folder of per-synset tars (`--synsets` of `--per_synset` images of `--image_kb` KB)
in one process, alternately with the checksum of every byte (the index's own) and with the
checksum of each image's last 64 bytes only (what the index checksummed before), the files in
the page cache; prints one JSON line: seconds per round of each, the extra cost per image and
per GB, and that cost extrapolated to ImageNet-21k (14,197,122 images, 1.31 TB; fall11 release)
on one core.

  PYTHONPATH=. .venv/bin/python benchmarks/index_checksum.py --workdir=/tmp/index_checksum
"""

import argparse
import io
import json
import os
import shutil
import tarfile
import time
import zlib

import numpy as np

from vit_jax.data import archive
from vit_jax.data.archive import indexing
from vit_jax.platform import cpus

I21K_IMAGES, I21K_BYTES = 14_197_122, 1.31e12


def _write(root: str, synsets: int, per_synset: int, image_bytes: int) -> int:
  os.makedirs(root)
  rng = np.random.default_rng(0)
  total = 0
  for s in range(synsets):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode='w') as tar:
      for i in range(per_synset):
        data = rng.integers(0, 256, image_bytes, dtype=np.uint8).tobytes()
        member = tarfile.TarInfo(f'n{s:08d}_{i}.JPEG')
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
        total += len(data)
    with open(os.path.join(root, f'n{s:08d}.tar'), 'wb') as f:
      f.write(out.getvalue())
  return total


def _tail_only(fd: int, offset: int, size: int) -> int:
  n = min(size, 64)
  return zlib.crc32(os.pread(fd, n, offset + size - n)) if n else 0


def _index_s(root: str, base: str) -> float:
  shutil.rmtree(base, ignore_errors=True)
  start = time.perf_counter()
  archive.build(root, 'tars', base, workers=1)
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--synsets', type=int, default=20)
  parser.add_argument('--per_synset', type=int, default=200)
  parser.add_argument('--image_kb', type=int, default=92)  # ImageNet-21k: 1.31 TB / 14.2 M
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  root, base = os.path.join(args.workdir, 'tars'), os.path.join(args.workdir, 'index')
  shutil.rmtree(args.workdir, ignore_errors=True)
  total = _write(root, args.synsets, args.per_synset, args.image_kb * 1000)
  images = args.synsets * args.per_synset
  full_crc = indexing.crc32
  _index_s(root, base)  # a first pass: the files in the page cache, the modules imported
  whole, tail = [], []
  for _ in range(args.rounds):
    indexing.crc32 = full_crc
    whole.append(_index_s(root, base))
    indexing.crc32 = _tail_only
    tail.append(_index_s(root, base))
  indexing.crc32 = full_crc
  extra = max(min(whole) - min(tail), 0.0)
  print(json.dumps(dict(
      benchmark='index_checksum', images=images, bytes=total, processor=cpus.describe(),
      whole_s=whole, tail_only_s=tail, extra_ms_per_image=1e3 * extra / images,
      extra_s_per_gb=extra / (total / 1e9),
      i21k_extra_core_hours_by_gb=extra / (total / 1e9) * I21K_BYTES / 1e9 / 3600,
      i21k_extra_core_hours_by_image=extra / images * I21K_IMAGES / 3600)))
  shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == '__main__':
  main()
