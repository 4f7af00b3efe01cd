"""tf.data input pipelines: an infinite, exactly resumable train stream and padded eval batches.

Every source feeds the same streams, given by its `info.DatasetInfo` (resolved once per run):
`source_records` reads the records of its source (`sources.Source.records`): a tfds dataset's
undecoded (the image stays encoded bytes, optionally cached in memory), an embedded dataset's
uint8 arrays in place (nothing encoded or decoded), each in the order tfds reads it;
`preprocess.decode` takes either. Both streams read
this process's share of the split, `tfds.even_splits(split, process_count)[index]`, run the
spec's preprocessing ops (vit_jax/data/ops.py) and return host-local numpy batches of
PER-PROCESS size.

Train stream (`train_iterator`). Epoch e is a shuffle of the share with a seed derived from
(seed, e) (`reshuffle_each_iteration=False`), so the stream is a pure function of the seed: the
example at position p (= step * batch_size + i) is example p % N of epoch p // N (N = share
size). Its augmentation seed is derived from (seed, process_index, p), each random op's from its
slot of that (`ops.op_seed`). Resuming at `start_step` opens epoch start // N and skips start % N
undecoded records (at most one epoch of cheap skipping); later epochs follow through
`Dataset.range(epoch + 1, ...).flat_map`. Decoding and augmentation run in a parallel but
order-preserving map, then batches drop their remainder (the stream is infinite).
(tf.data's shuffle also mixes in TF's global seed: code that calls `tf.random.set_seed` must use
the same value in the run and in its resumption.)

Eval batches (`eval_iterator`). Every example of the split is yielded exactly once over all
processes; the last batch is padded with zero images whose `mask` is 0, and every process yields
the same number of batches, ceil(max share size / batch_size), adding all-padding batches if its
share is smaller. The result can be iterated again for each evaluation. `padded_eval_batches`
does the same for any (stored image, label) records (`source_records`, `encoded_records`), e.g.
the few-shot training images or the ReaL label sets (vit_jax/evaluate/).

TensorFlow is kept off accelerators: the pipelines hide GPUs from TF before building.

tf.data's autotuner is off (`_options`) and the parallel maps run `PARALLEL_CALLS` batches at
once. With it on, deleting an iterator can stall the whole process for up to a minute: the
autotuner's thread (TF 2.21) can miss its wake-up when the iterator is cancelled and then sleeps
out its optimisation period, which doubles up to 60 s over the iterator's life, while the deleting
thread waits for it holding the GIL (a native stack of the waiting process ends in
`RootDataset::Iterator::~Iterator`).

A release read in place (`releases`: ImageNet-21k, the ILSVRC2012 archives) streams record keys
instead of image bytes: the shuffle and the resumption skip work on keys, each batch's images are
read in place (`_Reader`), decoded and preprocessed one by one, and an image that does not decode
is skipped (`_release_batch`), named in one warning the first time a run meets it and counted in
one line when the stream ends (`_counting_skipped`); once it is named, later meetings hand the
decoder no bytes, so libjpeg's own complaint about the file is not repeated epoch after epoch.
The stream stays a pure function of the seed. A read that fails (a file changed, gone or
unreadable since it was indexed) and a train batch whose every image fails to decode stop the
stream with one `UserError` line (`_said`), never a hang or an endless run of skipped images.
"""

import ctypes
import sys
from typing import Iterator, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from vit_jax.platform import cpus
from vit_jax.data import archive
from vit_jax.data import info as info_lib
from vit_jax.data import preprocess
from vit_jax.data import releases
from vit_jax.data import specs
from vit_jax.data.preprocess import hide_accelerators_from_tf
from vit_jax.errors import UserError

_FOREVER = np.iinfo(np.int64).max  # end of the epoch counter / position ranges
# Batches preprocessed at once by a pipeline's parallel map: one per usable core, at most 16 (what
# tf.data's AUTOTUNE starts from); each batch also runs up to 16 examples at once (`_map_examples`).
PARALLEL_CALLS = min(16, cpus.usable())


def train_iterator(*, info: info_lib.DatasetInfo, split: str, batch_size: int,
                   spec: specs.Spec, seed: int, start_step: int = 0, process_index: int = 0,
                   process_count: int = 1, shuffle_buffer: int = 50_000, cache: bool = True,
                   prefetch: int = 2,
                   sharding: str = 'process') -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of {'image': float32 [B, S, S, C], 'label': int32 [B]}, B = batch_size.

  Batch k of a run started at `start_step` equals batch start_step + k of a run started at 0.
  `info` is the dataset's (`info.get_info`, resolved once per run). The arguments are checked by
  `streams.train_iterator`, the entry point.

  `sharding='process'`: the stream of this process's share of the split (its own shuffle and
  positions). `sharding='global'`: every process streams the whole split in the same global
  order (global batch = batch_size x process_count) and keeps rows [i*B, (i+1)*B) of each global
  batch, decoding only those; example seeds use the global position, so the global batches are
  the same for any process count (at the price of every process reading all undecoded records).
  """
  hide_accelerators_from_tf()
  ds_info, release = info, info.release
  per_process = sharding == 'process'
  share = tfds.even_splits(split, n=process_count)[process_index] if per_process else split
  stream_id = process_index if per_process else 0
  rows = batch_size if per_process else batch_size * process_count  # records per stream batch
  num = ds_info.num_examples(share)
  if num == 0:
    raise UserError(f"process {process_index} of {process_count} gets no example of split "
                    f"'{split}' of '{ds_info.name}' ({ds_info.num_examples(split)} examples); use "
                    f"a larger split or fewer processes")
  records = source_records(ds_info, share, cache)

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
  out_channels = preprocess.output_channels(ds_info.image_shape, spec.channels)
  out_spec = tf.TensorSpec([spec.image_size, spec.image_size, out_channels], tf.float32)

  def process_example(stored, position):
    image = preprocess.decode(stored, channels)
    example_seed = preprocess.example_seed(seed_tensor, stream_id, position)
    return preprocess.train_preprocess(image, example_seed, spec, out_channels)

  def process_batch(records, positions):
    # Batching the undecoded records and looping inside one map call saves tf.data's per-element
    # overhead, which dominates for small images; each example still gets its own seed, so
    # results do not depend on the batching.
    stored, labels = records
    images = _map_examples(process_example, (stored, positions), out_spec)
    return {'image': images, 'label': tf.cast(labels, tf.int32)}

  ds = tf.data.Dataset.zip((stream, positions)).batch(rows, drop_remainder=True)
  if not per_process:  # keep this process's rows of the global batch, before decoding
    mine = slice(process_index * batch_size, (process_index + 1) * batch_size)
    ds = ds.map(as_written(lambda records, positions: (tuple(r[mine] for r in records),
                                                       positions[mine])))
  if release is None:
    ds = ds.map(as_written(process_batch), num_parallel_calls=PARALLEL_CALLS, deterministic=True)
    ds = ds.prefetch(prefetch).with_options(_options())
    return ds.as_numpy_iterator()
  reader = _Reader(release)
  ds = ds.interleave(as_written(_release_batch(release, process_example, reader)),
                     cycle_length=PARALLEL_CALLS, num_parallel_calls=PARALLEL_CALLS,
                     deterministic=True)
  ds = ds.prefetch(prefetch).with_options(_options())
  return _counting_skipped(_said(ds.as_numpy_iterator(), reader, release.name), reader)


# The key under which a release's train batches carry the record keys of the corrupt images they
# skipped (-1 elsewhere); `_counting_skipped` takes it out of the batches and logs them.
_SKIPPED = 'skipped'


class _Reader:
  """keys int64 [n] -> their images' bytes, tf.string [n], read in place (releases.read), as a
  TF op. A read that fails (archive.ReadError: a file changed, gone or unreadable) fails
  the op, and so the stream, and is kept in `failure`, which `_said` raises as its one line: a
  read error is never an undecodable image, and never skipped."""

  def __init__(self, release):
    self.release = release
    self.failure = None
    self.undecodable = set()  # keys of images known not to decode: read as no bytes
    self.let_go = False  # the stream was let go of before its end (`_counting_skipped`)

  def _read(self, keys):
    if self.let_go:  # fails at once: the stream's reads in flight end, and it goes idle
      return np.full(len(keys), b'', dtype=object), False
    try:
      encoded = releases.read(self.release, keys)
      for i, key in enumerate(keys.tolist()):
        if key in self.undecodable:
          encoded[i] = b''  # fails to decode as before, without libjpeg's line again
      return np.asarray(encoded + [b''], dtype=object)[:-1], True
    except archive.ReadError as e:  # failed by the assertion below (a raise here would
      if self.failure is None:            # also log its traceback through TensorFlow)
        self.failure = e
      return np.full(len(keys), b'', dtype=object), False

  def __call__(self, keys):
    encoded, ok = tf.numpy_function(self._read, [keys], [tf.string, tf.bool], stateful=False)
    with tf.control_dependencies([tf.debugging.Assert(ok, [_READ_FAILED])]):
      encoded = tf.identity(encoded)
    encoded.set_shape(keys.shape)
    return encoded


_READ_FAILED = 'an image could not be read as indexed'


_ALL_FAILED = 'every image of a train batch failed to decode'


def _said(batches, reader: Optional[_Reader], what: str):
  """`batches`, with a failed read or a train batch of only undecodable images raised as one
  UserError line instead of TensorFlow's error."""
  try:
    yield from batches
  except tf.errors.OpError as e:
    if reader is not None:  # other reads may be in flight: never torn down (`_LET_GO`)
      reader.let_go = True
      _LET_GO.append(batches)
    if reader is not None and reader.failure is not None:
      raise reader.failure from None
    if _ALL_FAILED in str(e.message):
      raise UserError(f'{_ALL_FAILED} ({what}): the files are damaged; check them (the '
                      f'warnings above name the images skipped so far)') from None
    raise


def _release_batch(release, process_example, read: _Reader):
  """A batch of (key, label) records and their positions -> a dataset of one train batch: the
  images read and preprocessed one by one; an image that fails to decode is skipped and its slot
  takes the batch's first good images again, in order (so the batch keeps its size and the stream
  stays a pure function of the seed, resumable at any step); its key is in `_SKIPPED`. A read
  error fails the stream (`_Reader`); so does a batch whose every image fails to decode."""

  def batch(records, positions):
    keys, labels = records
    n = tf.shape(keys)[0]
    examples = tf.data.Dataset.from_tensor_slices((read(keys), labels, positions, keys))
    examples = examples.map(
        as_written(lambda e, label, p, k: (process_example(e, p), tf.cast(label, tf.int32), k)),
        num_parallel_calls=PARALLEL_CALLS, deterministic=True)
    image_spec = examples.element_spec[0]
    # One placeholder after the images: a batch whose every image fails still yields an element
    # (an empty one would make the interleave read the next batches forever, yielding nothing).
    end = tf.data.Dataset.from_tensors((tf.zeros(image_spec.shape, image_spec.dtype),
                                        tf.constant(0, tf.int32), tf.constant(-1, tf.int64)))
    examples = examples.ignore_errors().concatenate(end).batch(_FOREVER)

    def fill(images, labels, kept):
      images, labels, kept = images[:-1], labels[:-1], kept[:-1]
      good = tf.shape(kept)[0]
      check = tf.debugging.assert_positive(good, message=_ALL_FAILED)
      with tf.control_dependencies([check]):
        take = tf.range(n) % tf.maximum(good, 1)
      found = tf.reduce_any(tf.equal(keys[:, None], kept[None, :]), axis=1)
      return {'image': tf.gather(images, take), 'label': tf.gather(labels, take),
              _SKIPPED: tf.where(found, tf.constant(-1, tf.int64), keys)}

    return examples.map(as_written(fill))

  return batch


def real_label_set_batches(release, split, *, batch_size: int, spec: specs.Spec,
                           process_index: int, process_count: int) -> 'EvalBatches':
  """Eval batches of a release's validation images with ImageNet ReaL's label sets
  (releases.real_label_sets) as multi-hot 'label' [B, classes]; this process's share of `split`
  (a split expression over 'validation'), padded like `eval_iterator`'s batches."""
  sets = releases.real_label_sets(release)
  if sets is None or 'validation' not in release.splits:
    raise UserError(f'ImageNet ReaL needs the validation images and {releases.REAL_LABELS} in '
                    f'{release.root}')
  val = release.splits['validation']
  position = np.zeros(len(val.index), np.int64)
  position[val.rows] = np.arange(len(val.rows))
  widest = max([len(s) for s in sets] + [1])
  padded = np.full([len(sets), widest], -1, np.int64)
  for i, labels in enumerate(sets):
    padded[i, :len(labels)] = labels
  shares = tfds.even_splits(split, n=process_count)
  counts = []
  for share in shares:
    if any(part is not val for part, _, _ in release.select(share)):
      raise UserError(f"ImageNet ReaL scores the validation images: use a split of "
                      f"'validation', not {split!r}")
    counts.append(sum(len(rows) for _, rows, _ in release.select(share)))
  keys, _ = releases.records(release, shares[process_index])
  rows = releases.key_rows(keys)
  classes = len(release.classes)
  records = tf.data.Dataset.from_tensor_slices((keys, padded[position[rows]])).map(
      as_written(lambda k, s: (k, tf.reduce_max(tf.one_hot(s, classes, dtype=tf.int32), 0))))
  return padded_eval_batches(records if len(keys) else None, count=len(keys),
                             num_batches=-(-max(counts) // batch_size), batch_size=batch_size,
                             spec=spec, stored_shape=(None, None, 3), label_shape=(classes,),
                             read=_Reader(release))


# Release streams let go of before their end (`_counting_skipped`, `_said`). TensorFlow's teardown
# of such a pipeline can wait forever (for a call that never ends), at once or when the process
# ends, so they are never torn down: the list holds one reference more than Python knows of, and
# the process's end frees them with the rest of its memory.
_LET_GO = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_LET_GO))


def _counting_skipped(batches, reader: _Reader) -> Iterator[dict[str, np.ndarray]]:
  """The batches without `_SKIPPED`; an image skipped is one warning line on stderr (and in the
  absl log) the first time this run meets it, and, when the stream ends, one line counts them."""
  release, met = reader.release, 0
  try:
    for batch in batches:
      for key in batch.pop(_SKIPPED).tolist():
        if key < 0:
          continue
        met += 1
        if key not in reader.undecodable:
          reader.undecodable.add(key)
          _warn(f'skipped an image of {release.name} that does not decode: '
                f'{releases.image_name(release, key)} (skipped whenever it is met; named once)')
      yield batch
  except GeneratorExit:
    # Let go of before its end (a finished run, a dropped iterator): its reads stop now, and the
    # pipeline is never torn down (`_LET_GO`).
    reader.let_go = True
    _LET_GO.append(batches)
    raise
  finally:
    if reader.undecodable:
      n = len(reader.undecodable)
      names = releases.listed(sorted(releases.image_name(release, k) for k in reader.undecodable))
      _warn(f'{n} image{"s" if n > 1 else ""} of {release.name} did not decode and '
            f'{"were" if n > 1 else "was"} skipped {met} time{"s" if met > 1 else ""} in this '
            f'run: {names}')


def _warn(line: str) -> None:
  logging.warning(line)
  print(f'warning: {line}', file=sys.stderr, flush=True)


class EvalBatches:
  """Re-iterable eval batches: each `iter()` starts a new pass over the (cached) split."""

  def __init__(self, ds: tf.data.Dataset, num_batches: int, reader: Optional[_Reader] = None):
    self._ds = ds
    self.num_batches = num_batches
    self._reader = reader

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    if self._reader is None:
      return self._ds.as_numpy_iterator()
    return _said(self._ds.as_numpy_iterator(), self._reader, self._reader.release.name)

  def __len__(self) -> int:
    return self.num_batches


def eval_iterator(*, info: info_lib.DatasetInfo, split: str, batch_size: int,
                  spec: specs.Spec, process_index: int = 0, process_count: int = 1,
                  cache: bool = True) -> tuple[EvalBatches, int]:
  """Returns (batches, num_batches) of {'image', 'label', 'mask'} for one process.

  `mask` is float32 [B]: 1 for real examples, 0 for padding (zero image, label 0). All processes
  get the same num_batches; the masks sum to the split size over all processes.
  The arguments are checked by `streams.eval_iterator`, the entry point.
  """
  hide_accelerators_from_tf()
  ds_info, release = info, info.release
  total = ds_info.num_examples(split)
  if total == 0:
    raise UserError(f"split '{split}' of '{ds_info.name}' is empty; pick a non-empty eval split")
  shares = tfds.even_splits(split, n=process_count)
  counts = [ds_info.num_examples(s) for s in shares]
  num_batches = -(-max(counts) // batch_size)
  records = None
  if counts[process_index]:
    records = source_records(ds_info, shares[process_index], cache)
  batches = padded_eval_batches(records, count=counts[process_index], num_batches=num_batches,
                                batch_size=batch_size, spec=spec, stored_shape=ds_info.image_shape,
                                read=_Reader(release) if release else None,
                                border=getattr(ds_info.source, 'border', 0))
  return batches, num_batches


def padded_eval_batches(records: Optional[tf.data.Dataset], *, count: int, num_batches: int,
                        batch_size: int, spec: specs.Spec, stored_shape,
                        label_shape: tuple[int, ...] = (), read=None,
                        border: int = 0) -> EvalBatches:
  """`num_batches` batches {'image', 'label', 'mask'} of `count` (stored image, label) records
  (`source_records`; with `read`, a `_Reader`: (key, label) records whose images it reads).

  The last real batch is padded with zero images, zero labels and mask 0, then all-padding
  batches follow up to `num_batches`. Labels are int32 of shape [B, *label_shape] (a multi-hot
  label set has label_shape (K,)). `records` may be None when `count` is 0. `border` pixels
  are cropped from each side of every decoded image first (ObjectNet's 1-pixel frame; a
  source's `border`).
  """
  channels = preprocess.decode_channels(stored_shape)
  size = spec.image_size
  out_channels = preprocess.output_channels(stored_shape, spec.channels)
  out_spec = tf.TensorSpec([size, size, out_channels], tf.float32)
  label_pad = [[0, 0]] * len(label_shape)

  def process_example(stored):
    image = preprocess.decode(stored, channels)
    if border:
      image = image[border:-border, border:-border]
    return preprocess.eval_preprocess(image, spec, out_channels)

  def process_batch(stored, labels):
    return pad(_map_examples(process_example, stored, out_spec), labels)

  def pad(images, labels):
    """A possibly partial batch -> a full batch, padded with zero images and mask 0."""
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
  })
  if read is not None and real_batches:
    # Keys read in place, a batch at a time; an image that does not decode is left out (the
    # split's last batches then hold fewer real rows, and padding makes up the count). Errors
    # are ignored per decoded image only: a read error fails the batches (`_Reader`).
    def decoded(keys, labels):
      examples = tf.data.Dataset.from_tensor_slices((read(keys), labels))
      return examples.map(as_written(lambda e, label: (process_example(e), label))).ignore_errors()

    ds = records.batch(batch_size).interleave(
        as_written(decoded), cycle_length=PARALLEL_CALLS, block_length=batch_size,
        num_parallel_calls=PARALLEL_CALLS, deterministic=True)
    ds = ds.batch(batch_size).map(as_written(pad))
    ds = ds.concatenate(padding.repeat()).take(num_batches)
    return EvalBatches(ds.prefetch(1).with_options(_options()), num_batches, read)
  padding = padding.repeat(num_batches - real_batches)
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
  rewrite costs seconds of every run's start, and it writes each rewritten function to a file in
  the temp dir that it never deletes."""
  return tf.autograph.experimental.do_not_convert(fn)


def _map_examples(fn, elems, out_spec: tf.TensorSpec) -> tf.Tensor:
  """Applies `fn` to each example of a batch (a graph loop with some intra-batch parallelism)."""
  each = as_written(lambda args: fn(*args) if isinstance(args, tuple) else fn(args))
  return tf.map_fn(each, elems,
                   fn_output_signature=out_spec, parallel_iterations=16)


def split_records(info: info_lib.DatasetInfo, split, *, cache: bool):
  """(records, read) of a split of any source, in a fixed order (`source_records`), and
  `read`: None, or for a source read in place, whose records are (record key, label), the
  `_Reader` of their images (as `padded_eval_batches` takes it)."""
  return source_records(info, split, cache), _Reader(info.release) if info.release else None


def source_records(info: info_lib.DatasetInfo, split, cache: bool) -> tf.data.Dataset:
  """The source's records of `split` in read order (`sources.Source.records`): (stored image,
  label), the encoded bytes of a tfds record (optionally cached in memory) or the uint8 pixels
  of an embedded dataset's arrays (`preprocess.decode` takes either); (record key, label) of a
  source read in place."""
  return info.source.records(split, cache).with_options(_options())


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

