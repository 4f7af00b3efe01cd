"""tf.data input pipelines: an infinite, exactly resumable train stream and padded eval batches.

Both read this process's share of the split, `tfds.even_splits(split, process_count)[index]`,
and return host-local numpy batches of PER-PROCESS size.

Train stream (`train_iterator`). Records are read undecoded (the image stays encoded bytes) and
optionally cached in memory. Epoch e is a shuffle of the share with a seed derived from (seed, e)
(`reshuffle_each_iteration=False`), so the stream is a pure function of the seed: the example at
position p (= step * batch_size + i) is example p % N of epoch p // N (N = share size). Its
augmentation seed is derived from (seed, process_index, p). Resuming at `start_step` opens epoch
start // N and skips start % N undecoded records (at most one epoch of cheap skipping); later
epochs follow through `Dataset.range(epoch + 1, ...).flat_map`. Decoding and augmentation run in a
parallel but order-preserving map, then batches drop their remainder (the stream is infinite).
(tf.data's shuffle also mixes in TF's global seed: code that calls `tf.random.set_seed` must use
the same value in the run and in its resumption.)

Eval batches (`eval_iterator`). Every example of the split is yielded exactly once over all
processes; the last batch is padded with zero images whose `mask` is 0, and every process yields
the same number of batches, ceil(max share size / batch_size), adding all-padding batches if its
share is smaller. The result can be iterated again for each evaluation. `padded_eval_batches`
does the same for any (encoded image, label) records (`encoded_records`), e.g. the few-shot
training images or the ReaL label sets (vit_jax/evaluate/).

TensorFlow is kept off accelerators: the pipelines hide GPUs from TF before building.

tf.data's autotuner is off (`_options`) and the parallel maps run `PARALLEL_CALLS` batches at
once. With it on, deleting an iterator could stall the whole process for up to a minute: the
autotuner's thread (TF 2.21) can miss its wake-up when the iterator is cancelled and then sleeps
out its optimisation period, which doubles up to 60 s over the iterator's life, while the deleting
thread waits for it holding the GIL. Seen as 18-73 s stalls of in-process test runs (a native
stack of the waiting process ended in `RootDataset::Iterator::~Iterator`) and, in isolation, as 1
of 8 deletions taking 10.8 s instead of 0.17-0.19 s (iterators 70 s old, the other core busy;
autotune off: 8 of 8 at 0.18-0.20 s). The default config's train pipeline alone delivers 64-69k
images/s with it off against 53-54k with it on (AMD EPYC family 26 model 2, 2 cores).
"""

from typing import Iterator, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.platform import cpus
from vit_jax.data import info as info_lib
from vit_jax.data import preprocess
from vit_jax.data import specs
from vit_jax.errors import UserError

_FOREVER = np.iinfo(np.int64).max  # end of the epoch counter / position ranges
# Batches preprocessed at once by a pipeline's parallel map: one per usable core, at most 16 (what
# tf.data's AUTOTUNE starts from); each batch also runs up to 16 examples at once (`_map_examples`).
PARALLEL_CALLS = min(16, cpus.usable())


def hide_accelerators_from_tf() -> None:
  """Makes TF use the CPU only, so it never takes GPU memory from JAX (no-op if too late)."""
  try:
    tf.config.set_visible_devices([], 'GPU')
  except (RuntimeError, ValueError):  # Devices already initialised, or no such device type.
    pass


def train_iterator(*, dataset: str, split: str, data_dir: Optional[str], batch_size: int,
                   spec: specs.TrainSpec, seed: int, start_step: int = 0, process_index: int = 0,
                   process_count: int = 1, shuffle_buffer: int = 50_000, cache: bool = True,
                   prefetch: int = 2,
                   sharding: str = 'process') -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of {'image': float32 [B, S, S, C], 'label': int32 [B]}, B = batch_size.

  Batch k of a run started at `start_step` equals batch start_step + k of a run started at 0.
  The arguments are checked by `streams.train_iterator`, the entry point.

  `sharding='process'`: the stream of this process's share of the split (its own shuffle and
  positions). `sharding='global'`: every process streams the whole split in the same global
  order (global batch = batch_size x process_count) and keeps rows [i*B, (i+1)*B) of each global
  batch, decoding only those; example seeds use the global position, so the global batches are
  the same for any process count (at the price of every process reading all undecoded records).
  """
  hide_accelerators_from_tf()
  builder = info_lib.load_builder(dataset, data_dir)
  ds_info = info_lib.info_from_builder(builder)
  per_process = sharding == 'process'
  share = tfds.even_splits(split, n=process_count)[process_index] if per_process else split
  stream_id = process_index if per_process else 0
  rows = batch_size if per_process else batch_size * process_count  # records per stream batch
  num = ds_info.num_examples(share)
  if num == 0:
    raise UserError(f"process {process_index} of {process_count} gets no example of split "
                    f"'{split}' of '{dataset}' ({ds_info.num_examples(split)} examples); use a "
                    f"larger split or fewer processes")
  records = _records(builder, ds_info, share, cache)

  seed_tensor = tf.constant(seed, tf.int64)
  buffer = min(shuffle_buffer, num)

  def epoch(e):
    # Full-range int64 shuffle seed, a pure function of (seed, epoch).
    epoch_seed = tf.random.stateless_uniform(
        [], seed=tf.stack([seed_tensor, tf.cast(e, tf.int64)]), minval=None, maxval=None,
        dtype=tf.int64)
    return records.shuffle(buffer, seed=epoch_seed, reshuffle_each_iteration=False)

  start = start_step * rows
  first_epoch, skip = divmod(start, num)
  stream = epoch(tf.constant(first_epoch, tf.int64)).skip(skip)
  later = tf.data.Dataset.range(first_epoch + 1, _FOREVER).flat_map(as_written(epoch))
  stream = stream.concatenate(later)
  positions = tf.data.Dataset.range(start, _FOREVER)
  channels = preprocess.decode_channels(ds_info.image_shape)
  out_spec = tf.TensorSpec(
      [spec.image_size, spec.image_size, preprocess.output_channels(ds_info.image_shape,
                                                                     spec.channels)],
      tf.float32)

  def process_example(encoded, position):
    image = preprocess.decode(encoded, channels)
    example_seed = preprocess.example_seed(seed_tensor, stream_id, position)
    return preprocess.train_preprocess(image, example_seed, spec)

  def process_batch(records, positions):
    # Batching the undecoded records and looping inside one map call is ~2.5x faster than one
    # map call per example (tf.data's per-element overhead dominates for small images); each
    # example still gets its own seed, so results do not depend on the batching.
    encoded, labels = records
    images = _map_examples(process_example, (encoded, positions), out_spec)
    return {'image': images, 'label': tf.cast(labels, tf.int32)}

  ds = tf.data.Dataset.zip((stream, positions)).batch(rows, drop_remainder=True)
  if not per_process:  # keep this process's rows of the global batch, before decoding
    mine = slice(process_index * batch_size, (process_index + 1) * batch_size)
    ds = ds.map(as_written(lambda records, positions: (tuple(r[mine] for r in records),
                                                       positions[mine])))
  ds = ds.map(as_written(process_batch), num_parallel_calls=PARALLEL_CALLS, deterministic=True)
  ds = ds.prefetch(prefetch).with_options(_options())
  return ds.as_numpy_iterator()


class EvalBatches:
  """Re-iterable eval batches: each `iter()` starts a new pass over the (cached) split."""

  def __init__(self, ds: tf.data.Dataset, num_batches: int):
    self._ds = ds
    self.num_batches = num_batches

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self._ds.as_numpy_iterator()

  def __len__(self) -> int:
    return self.num_batches


def eval_iterator(*, dataset: str, split: str, data_dir: Optional[str], batch_size: int,
                  spec: specs.EvalSpec, process_index: int = 0, process_count: int = 1,
                  cache: bool = True) -> tuple[EvalBatches, int]:
  """Returns (batches, num_batches) of {'image', 'label', 'mask'} for one process.

  `mask` is float32 [B]: 1 for real examples, 0 for padding (zero image, label 0). All processes
  get the same num_batches; the masks sum to the split size over all processes.
  The arguments are checked by `streams.eval_iterator`, the entry point.
  """
  hide_accelerators_from_tf()
  builder = info_lib.load_builder(dataset, data_dir)
  ds_info = info_lib.info_from_builder(builder)
  total = ds_info.num_examples(split)
  if total == 0:
    raise UserError(f"split '{split}' of '{dataset}' is empty; pick a non-empty eval split")
  shares = tfds.even_splits(split, n=process_count)
  counts = [ds_info.num_examples(s) for s in shares]
  num_batches = -(-max(counts) // batch_size)
  records = None
  if counts[process_index]:
    records = _records(builder, ds_info, shares[process_index], cache)
  batches = padded_eval_batches(records, count=counts[process_index], num_batches=num_batches,
                                batch_size=batch_size, spec=spec, stored_shape=ds_info.image_shape)
  return batches, num_batches


def padded_eval_batches(records: Optional[tf.data.Dataset], *, count: int, num_batches: int,
                        batch_size: int, spec: specs.EvalSpec, stored_shape,
                        label_shape: tuple[int, ...] = ()) -> EvalBatches:
  """`num_batches` batches {'image', 'label', 'mask'} of `count` (encoded image, label) records.

  The last real batch is padded with zero images, zero labels and mask 0, then all-padding
  batches follow up to `num_batches`. Labels are int32 of shape [B, *label_shape] (a multi-hot
  label set has label_shape (K,)). `records` may be None when `count` is 0.
  """
  channels = preprocess.decode_channels(stored_shape)
  size = spec.image_size
  out_spec = tf.TensorSpec(
      [size, size, preprocess.output_channels(stored_shape, spec.channels)], tf.float32)
  label_pad = [[0, 0]] * len(label_shape)

  def process_example(encoded):
    return preprocess.eval_preprocess(preprocess.decode(encoded, channels), spec)

  def process_batch(encoded, labels):
    """A possibly partial batch -> a full batch, padded with zero images and mask 0."""
    images = _map_examples(process_example, encoded, out_spec)
    real = tf.shape(labels)[0]
    fill = batch_size - real
    batch = {
        'image': tf.pad(images, [[0, fill], [0, 0], [0, 0], [0, 0]]),
        'label': tf.pad(tf.cast(labels, tf.int32), [[0, fill]] + label_pad),
        'mask': tf.pad(tf.ones([real], tf.float32), [[0, fill]]),
    }
    for value in batch.values():
      value.set_shape([batch_size, *value.shape[1:]])
    return batch

  real_batches = -(-count // batch_size)
  padding = tf.data.Dataset.from_tensors({
      'image': tf.zeros([batch_size, *out_spec.shape], tf.float32),
      'label': tf.zeros([batch_size, *label_shape], tf.int32),
      'mask': tf.zeros([batch_size], tf.float32),
  }).repeat(num_batches - real_batches)
  if real_batches:
    # The records are read to their end (no `take` on them), so a cache completes in pass one.
    ds = records.batch(batch_size)
    ds = ds.map(as_written(process_batch), num_parallel_calls=PARALLEL_CALLS, deterministic=True)
    ds = ds.concatenate(padding)
  else:
    ds = padding
  ds = ds.prefetch(1).with_options(_options())
  return EvalBatches(ds, num_batches)


def as_written(fn):
  """`fn` traced as written, without AutoGraph's source rewrite, for every function this project
  gives tf.data: they branch on Python values only (tensor branches use tf.switch_case), the
  rewrite cost ~2.6 s of every run's start (cProfile of a 24-step ViT-Ze/4 run), and it writes
  each rewritten function to a file in the temp dir that it never deletes."""
  return tf.autograph.experimental.do_not_convert(fn)


def _map_examples(fn, elems, out_spec: tf.TensorSpec) -> tf.Tensor:
  """Applies `fn` to each example of a batch (a graph loop with some intra-batch parallelism)."""
  each = as_written(lambda args: fn(*args) if isinstance(args, tuple) else fn(args))
  return tf.map_fn(each, elems,
                   fn_output_signature=out_spec, parallel_iterations=16)


def _records(builder, ds_info: info_lib.DatasetInfo, split, cache: bool) -> tf.data.Dataset:
  """(encoded image bytes, label) of `split` in a fixed order, optionally cached in memory."""
  return encoded_records(builder, split, ds_info.image_key,
                         lambda ex: ex[ds_info.label_key], cache=cache)


def encoded_records(builder, split, image_key: str, label_fn, *, cache: bool) -> tf.data.Dataset:
  """(encoded image bytes, label_fn(example)) of `split` in stored order, optionally cached."""
  ds = builder.as_dataset(
      split=split,
      shuffle_files=False,
      decoders={image_key: tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(try_autocache=False, add_tfds_id=False),
  )
  ds = ds.map(as_written(lambda ex: (ex[image_key], label_fn(ex))),
              num_parallel_calls=PARALLEL_CALLS, deterministic=True)
  ds = ds.cache() if cache else ds
  return ds.with_options(_options())


def _options() -> tf.data.Options:
  """Deterministic order, and no autotuner thread (see the module docstring)."""
  options = tf.data.Options()
  options.deterministic = True
  options.autotune.enabled = False
  return options

