"""The trainer's input streams: the arguments checked, then the one tf.data pipeline (pipeline.py).

`train_iterator` and `eval_iterator` validate their arguments and hand every source (the
embedded datasets read from their arrays, tfds datasets, image folders, the releases read in
place) to the same streams, whose contract pipeline.py's docstring states: an infinite stream
that is a pure function of the seed and resumes exactly at any step; eval batches padded with
mask 0, the same number on every process, every example once. A run passes the dataset's info
(`info.get_info`, resolved once); other callers may name the dataset instead.
"""

from typing import Any, Iterator, Optional

import numpy as np

from vit_jax.data import specs
from vit_jax.data.choices import SHARDINGS
from vit_jax.errors import UserError


def train_iterator(*, split: str, batch_size: int, spec: specs.Spec, seed: int,
                   dataset: Optional[str] = None, data_dir: Optional[str] = None, info=None,
                   start_step: int = 0, process_index: int = 0,
                   process_count: int = 1, shuffle_buffer: int = 50_000, cache: bool = True,
                   prefetch: int = 2,
                   sharding: str = 'process') -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of {'image': float32 [B, S, S, C], 'label': int32 [B]} (B = batch_size):
  the arguments checked (`spec`: a `specs.train_spec`), then pipeline.py's stream (whose
  docstring describes the arguments) of `info`, or of `dataset` in `data_dir`."""
  check_train_args(spec=spec, batch_size=batch_size, seed=seed, start_step=start_step,
                          process_index=process_index, process_count=process_count,
                          shuffle_buffer=shuffle_buffer, sharding=sharding)
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top  (imports TensorFlow)
  return pipeline.train_iterator(
      info=_info(info, dataset, data_dir), split=split, batch_size=batch_size, spec=spec,
      seed=seed, start_step=start_step, process_index=process_index, process_count=process_count,
      shuffle_buffer=shuffle_buffer, cache=cache, prefetch=prefetch, sharding=sharding)


def eval_iterator(*, split: str, batch_size: int, spec: specs.Spec, dataset: Optional[str] = None,
                  data_dir: Optional[str] = None, info=None, process_index: int = 0,
                  process_count: int = 1, cache: bool = True) -> tuple[Any, int]:
  """(re-iterable batches of {'image', 'label', 'mask'}, num_batches) for one process: the
  arguments checked (`spec`: a `specs.eval_spec`), then pipeline.py's batches."""
  check_eval_args(spec=spec, batch_size=batch_size, process_index=process_index,
                         process_count=process_count)
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top  (imports TensorFlow)
  return pipeline.eval_iterator(info=_info(info, dataset, data_dir), split=split,
                                batch_size=batch_size, spec=spec, process_index=process_index,
                                process_count=process_count, cache=cache)


def _info(info, dataset: Optional[str], data_dir: Optional[str]):
  """The dataset's info: `info` as the caller resolved it (a run does, once), else looked up."""
  if info is not None:
    return info
  from vit_jax.data import info as info_lib  # pylint: disable=g-import-not-at-top  (imports tfds)
  return info_lib.get_info(dataset, data_dir)


def check_train_args(*, spec, batch_size, seed, start_step, process_index, process_count,
                     shuffle_buffer, sharding) -> None:
  """The train stream's arguments checked (UserError naming the bad one)."""
  if sharding not in SHARDINGS:
    raise UserError(f'unknown data_sharding {sharding!r}: use config.data_sharding=process or '
                    f'global')
  check_spec(spec, train=True)
  check_int('batch_size', batch_size, 1)
  check_int('start_step', start_step, 0)
  check_int('shuffle_buffer', shuffle_buffer, 1)
  check_int('seed', seed, -2**63)
  check_processes(process_index, process_count)


def check_eval_args(*, spec, batch_size, process_index, process_count) -> None:
  """The eval batches' arguments checked (UserError naming the bad one)."""
  check_spec(spec, train=False)
  check_int('batch_size', batch_size, 1)
  check_processes(process_index, process_count)


def check_spec(spec, train: bool) -> None:
  """`spec` is parsed preprocessing of its kind (`specs.train_spec` / `specs.eval_spec`)."""
  kind = 'train' if train else 'eval'
  if not isinstance(spec, specs.Spec) or spec.train != train:
    raise UserError(f'spec must be {kind} preprocessing parsed by specs.{kind}_spec '
                    f"(e.g. specs.{kind}_spec('resize', 28)), got {spec!r}")


def check_int(name: str, value, minimum: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise UserError(f'{name} must be an int >= {minimum}, got {value!r}')


def check_processes(process_index: int, process_count: int) -> None:
  check_int('process_count', process_count, 1)
  if not isinstance(process_index, (int, np.integer)) or not 0 <= process_index < process_count:
    raise UserError(f'process_index must be in [0, {process_count}), got {process_index!r}')


__all__ = ['check_eval_args', 'check_int', 'check_processes', 'check_spec', 'check_train_args',
           'eval_iterator', 'train_iterator']
