"""In-memory input pipelines for the embedded datasets (NumPy, no TensorFlow).

mnist5k and digits are a few megabytes of uint8 arrays read from installed packages
(`<module>.load_arrays()`, `split_indices`): their batches are cut from the arrays directly, with
the contract of the tf.data pipelines (pipeline.py's docstring) and without importing TensorFlow.
`serves(dataset, split, spec)` says when: a split of an embedded dataset (a name, or an expression
like 'train[:90%]': the examples tfds would read, catalog.py), train crop
'pad_crop' or 'resize', any flip, no RandAugment, a shuffle buffer holding the whole split; eval
crop 'resize'; channels as stored or gray tiled to 3. Resizing is bilinear without antialiasing
on half-pixel centres (`tf.image.resize`'s convention: the same values when enlarging, within
1e-3 of 255 when shrinking).
Anything else goes to tf.data (`streams`).

Train stream: the share of a process is its `np.array_split` part of the split's rows in source
order (`sharding='process'`) or the whole split (`'global'`, every process then keeps its rows
of each global batch). Epoch e is the permutation of the share drawn by Philox keyed (seed, e);
the example at position p is example p % N of epoch p // N, and its augmentation draws come from
a hash of (seed, stream, p, draw) (stream = the process index, or 0 for global sharding). So a
batch is a pure function of (seed, step), and a run resumed at any step continues exactly. The
draws differ from tf.data's, so the same config trains on other crops and orders here than it
would on a prepared copy of the dataset in tf.data; each is exactly reproducible on its own
(`config.input_pipeline=tf.data` keeps tf.data's). The epoch orders come from NumPy's
`Generator.permutation`, whose stream NumPy may change between versions: requirements.lock pins
the version a run and its resumption should share.

Eval batches: the process's `np.array_split` part of the split, cut into batches of
`batch_size` and preprocessed batch by batch on each pass, the last padded with zero images, label 0 and mask 0, then all-padding
batches up to the largest share's batch count.
"""

import functools
from typing import Iterator, Optional, Union

import numpy as np

from vit_jax.data import catalog
from vit_jax.data import embedded
from vit_jax.data import specs
from vit_jax.errors import UserError

_TRAIN_CROPS = ('pad_crop', 'resize')
_EVAL_CROPS = ('resize',)
_MASK64 = (1 << 64) - 1


def serves(dataset: str, split: str, spec: Union[specs.TrainSpec, specs.EvalSpec],
           shuffle_buffer: Optional[int] = None) -> bool:
  """Whether these pipelines implement `spec` on `split` of `dataset` (see the docstring)."""
  facts = catalog.embedded_facts(dataset, split)
  if facts is None:
    return False
  if spec.channels not in (None, facts.image_shape[-1], 3):
    return False  # RGB to gray: tf.data's op
  if isinstance(spec, specs.TrainSpec):
    return (spec.crop in _TRAIN_CROPS and not spec.randaug_layers and
            shuffle_buffer is not None and shuffle_buffer >= facts.num_examples)
  return spec.crop in _EVAL_CROPS


@functools.lru_cache(maxsize=None)
def _source(dataset: str) -> tuple[np.ndarray, np.ndarray, dict]:
  """(images, labels, {split: rows}) of an embedded dataset, its splits checked; read once per
  process (read-only), not once per split (a run reads a train and an eval split)."""
  module = catalog.EMBEDDED[dataset]
  images, labels = module.load_arrays()
  splits = embedded.checked_splits(dataset, module.split_indices(labels), module.SPLIT_SIZES)
  for array in (images, labels):
    array.flags.writeable = False
  return images, labels, splits


@functools.lru_cache(maxsize=None)
def _split_arrays(dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, H, W, C], labels int32 [N]) of a split or split expression (the examples
  tfds would read: catalog.py), rows in source order."""
  images, labels, splits = _source(dataset)
  rows = catalog.rows(split, splits)
  out = images[rows], labels[rows].astype(np.int32)
  for array in out:
    array.flags.writeable = False
  return out


def train_iterator(*, dataset: str, split: str, batch_size: int, spec: specs.TrainSpec,
                   seed: int, start_step: int = 0, process_index: int = 0,
                   process_count: int = 1,
                   sharding: str = 'process') -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of {'image': float32 [B, S, S, C], 'label': int32 [B]}; batch k of a run
  started at `start_step` equals batch start_step + k of a run started at 0. The arguments are
  checked by `streams.train_iterator`."""
  images, labels = _split_arrays(dataset, split)
  per_process = sharding == 'process'
  share = np.array_split(np.arange(len(labels)), process_count)[process_index] if per_process \
      else np.arange(len(labels))
  if not len(share):
    raise UserError(f"process {process_index} of {process_count} gets no example of split "
                    f"'{split}' of '{dataset}' ({len(labels)} examples); use a larger split or "
                    f"fewer processes")
  rows = batch_size if per_process else batch_size * process_count
  mine = slice(0, batch_size) if per_process else slice(
      process_index * batch_size, (process_index + 1) * batch_size)
  return _train_batches(images, labels, share, spec, seed, process_index if per_process else 0,
                        start_step * rows, rows, mine)


def _train_batches(images, labels, share, spec, seed, stream, position, rows, mine):
  """The stream from `position` on: `rows` positions a batch, this process keeping `mine`."""
  orders = {}  # epoch -> permutation of the share (the one or two epochs of the current batch)
  while True:
    positions = np.arange(position, position + rows, dtype=np.int64)[mine]
    epochs, offsets = np.divmod(positions, len(share))
    picked = np.empty(len(positions), np.int64)
    for e in np.unique(epochs):
      if e not in orders:
        orders = {k: v for k, v in orders.items() if k >= e - 1}
        orders[e] = _permutation(seed, int(e), len(share))
      this = epochs == e
      picked[this] = share[orders[e][offsets[this]]]
    yield {'image': _train_images(images[picked], spec, seed, stream, positions),
           'label': labels[picked]}
    position += rows


def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """Epoch `epoch`'s order of n examples: a pure function of (seed, epoch)."""
  key = np.array([seed & _MASK64, epoch & _MASK64], dtype=np.uint64)
  return np.random.Generator(np.random.Philox(key=key)).permutation(n)


def _draws(seed: int, stream: int, positions: np.ndarray, draw: int) -> np.ndarray:
  """uint64 draw number `draw` of the examples at `positions`: splitmix64's finaliser chained
  over (seed, stream, position, draw), so each example's draws depend on nothing else."""
  h = np.full(positions.shape, seed & _MASK64, dtype=np.uint64)
  with np.errstate(over='ignore'):  # uint64 arithmetic wraps, as the hash means it to
    for value in (stream, positions, draw):
      h = _mix(h ^ (np.asarray(value, np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
  return h


def _mix(z: np.ndarray) -> np.ndarray:
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def _uniform_ints(draws: np.ndarray, high: int) -> np.ndarray:
  """Integers in [0, high) from uint64 draws (the top 32 bits: bias < high / 2^32)."""
  return ((draws >> np.uint64(32)) % np.uint64(high)).astype(np.int64)


def _train_images(batch: np.ndarray, spec: specs.TrainSpec, seed: int, stream: int,
                  positions: np.ndarray) -> np.ndarray:
  """uint8 [B, H, W, C] -> float32 [B, S, S, C'] in [-1, 1]: the crop, the resize, the flip, the
  channels, the value range, in `preprocess.train_preprocess`'s order (the draws are this
  module's)."""
  if spec.crop == 'pad_crop' and spec.pad:
    n, h, w, _ = batch.shape
    pad = spec.pad
    padded = np.pad(batch, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    top = _uniform_ints(_draws(seed, stream, positions, 0), 2 * pad + 1)
    left = _uniform_ints(_draws(seed, stream, positions, 1), 2 * pad + 1)
    batch = padded[np.arange(n)[:, None, None], (top[:, None] + np.arange(h))[:, :, None],
                   (left[:, None] + np.arange(w))[:, None, :]]
  batch = resize(batch, spec.image_size)
  if spec.flip:
    flip = (_draws(seed, stream, positions, 2) >> np.uint64(63)).astype(bool)
    batch = np.where(flip[:, None, None, None], batch[:, :, ::-1], batch)
  return _finish(batch, spec.channels)


def resize(batch: np.ndarray, size: int) -> np.ndarray:
  """[B, H, W, C] -> float32 [B, size, size, C], bilinear without antialiasing on half-pixel
  centres (what `preprocess.resize` asks of tf.image.resize); the batch as float32 if it is
  already that size."""
  batch = batch.astype(np.float32)
  if batch.shape[1:3] == (size, size):
    return batch
  rows, cols = _bilinear_weights(batch.shape[1], size), _bilinear_weights(batch.shape[2], size)
  return np.einsum('oh,bhwc,pw->bopc', rows, batch, cols, optimize=True).astype(np.float32)


@functools.lru_cache(maxsize=32)
def _bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in]: output pixel o samples input coordinate (o + 0.5) * n_in / n_out - 0.5
  between its two neighbouring pixels (the edge pixel beyond the edges)."""
  where = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
  low = np.floor(where)
  frac = where - low
  weights = np.zeros((n_out, n_in))
  np.add.at(weights, (np.arange(n_out), np.clip(low, 0, n_in - 1).astype(int)), 1 - frac)
  np.add.at(weights, (np.arange(n_out), np.clip(low + 1, 0, n_in - 1).astype(int)), frac)
  weights.flags.writeable = False
  return weights


def _finish(batch: np.ndarray, channels: Optional[int]) -> np.ndarray:
  """[0, 255] -> float32 in [-1, 1] as (x - 127.5) / 127.5, gray tiled to 3 channels if asked."""
  if channels == 3 and batch.shape[-1] == 1:
    batch = np.repeat(batch, 3, axis=-1)
  return (batch.astype(np.float32) - np.float32(127.5)) / np.float32(127.5)


class EvalBatches:
  """Re-iterable padded eval batches of one process (the protocol of `pipeline.EvalBatches`),
  preprocessed batch by batch."""

  def __init__(self, images: np.ndarray, labels: np.ndarray, spec: specs.EvalSpec,
               batch_size: int, num_batches: int):
    self._images, self._labels, self._spec = images, labels, spec
    self._batch_size = batch_size
    self.num_batches = num_batches

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    size = self._batch_size
    for k in range(self.num_batches):
      images = self._images[k * size:(k + 1) * size]
      if len(images):
        images = _finish(resize(images, self._spec.image_size), self._spec.channels)
      else:
        images = np.zeros((0, *self._shape()), np.float32)
      real, fill = len(images), size - len(images)
      yield {
          'image': np.concatenate([images, np.zeros((fill, *images.shape[1:]), np.float32)]),
          'label': np.concatenate([self._labels[k * size:(k + 1) * size],
                                   np.zeros([fill], np.int32)]),
          'mask': np.concatenate([np.ones([real], np.float32), np.zeros([fill], np.float32)]),
      }

  def __len__(self) -> int:
    return self.num_batches

  def _shape(self) -> tuple:
    channels = self._spec.channels or self._images.shape[-1]
    return self._spec.image_size, self._spec.image_size, channels


def in_read_order(dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8, labels int32) of a split or split expression in the order tfds reads it
  (few-shot evaluation takes the first n of each class in this order)."""
  images, labels, splits = _source(dataset)
  order = catalog.read_order(split, splits)
  return images[order], labels[order].astype(np.int32)


def eval_iterator(*, dataset: str, split: str, batch_size: int, spec: specs.EvalSpec,
                  process_index: int = 0, process_count: int = 1) -> tuple[EvalBatches, int]:
  """(batches, num_batches) of {'image', 'label', 'mask'}, as `pipeline.eval_iterator`; the
  arguments are checked by `streams.eval_iterator`."""
  images, labels = _split_arrays(dataset, split)
  shares = np.array_split(np.arange(len(labels)), process_count)
  num_batches = -(-max(len(s) for s in shares) // batch_size)
  mine = shares[process_index]
  batches = EvalBatches(images[mine], labels[mine], spec, batch_size, num_batches)
  return batches, num_batches


__all__ = ['EvalBatches', 'eval_iterator', 'in_read_order', 'serves', 'train_iterator']
