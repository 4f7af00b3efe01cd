"""The trainer's input streams: which pipeline serves a dataset, and the checks both share.

`train_iterator` and `eval_iterator` validate their arguments, then hand the embedded datasets
(mnist5k, digits) to `arrays` (NumPy, in memory, no TensorFlow) when `arrays.serves` says it
implements what the preprocessing asks for, and everything else to `pipeline` (tf.data). Both
keep the same contract (pipeline.py's docstring): an infinite stream that is a pure function of
the seed and resumes exactly at any step; eval batches padded with mask 0, the same number on
every process, every example once. A run on an embedded dataset then never imports TensorFlow
(the quickstart's runs, for one).
"""

from typing import Any, Iterator, Optional

import numpy as np

from vit_jax.data import specs
from vit_jax.data.choices import INPUT_PIPELINES, SHARDINGS
from vit_jax.errors import UserError


def train_iterator(*, dataset: str, split: str, data_dir: Optional[str], batch_size: int,
                   pp: Any, seed: int, start_step: int = 0, process_index: int = 0,
                   process_count: int = 1, shuffle_buffer: int = 50_000, cache: bool = True,
                   prefetch: int = 2, sharding: str = 'process',
                   pipeline: str = 'auto') -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of {'image': float32 [B, S, S, C], 'label': int32 [B]} (B = batch_size):
  the arguments checked (`pp` holds the keys of `specs.TrainSpec`), then the stream of `arrays`
  or `pipeline` (whose docstring describes the arguments). `pipeline='tf.data'` never uses
  `arrays` (the streams of runs recorded before they existed)."""
  spec = check_train_args(pp=pp, batch_size=batch_size, seed=seed, start_step=start_step,
                          process_index=process_index, process_count=process_count,
                          shuffle_buffer=shuffle_buffer, sharding=sharding)
  _check_pipeline(pipeline)
  from vit_jax.data import arrays  # pylint: disable=g-import-not-at-top
  if pipeline == 'auto' and arrays.serves(dataset, split, spec, shuffle_buffer):
    return arrays.train_iterator(dataset=dataset, split=split, batch_size=batch_size, spec=spec,
                                 seed=seed, start_step=start_step, process_index=process_index,
                                 process_count=process_count, sharding=sharding)
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.train_iterator(
      dataset=dataset, split=split, data_dir=data_dir, batch_size=batch_size, spec=spec, seed=seed,
      start_step=start_step, process_index=process_index, process_count=process_count,
      shuffle_buffer=shuffle_buffer, cache=cache, prefetch=prefetch, sharding=sharding)


def eval_iterator(*, dataset: str, split: str, data_dir: Optional[str], batch_size: int,
                  pp: Any, process_index: int = 0, process_count: int = 1,
                  cache: bool = True, pipeline: str = 'auto') -> tuple[Any, int]:
  """(re-iterable batches of {'image', 'label', 'mask'}, num_batches) for one process: the
  arguments checked (`pp` holds the keys of `specs.EvalSpec`), then the batches of `arrays` or
  `pipeline`; `pipeline` as in `train_iterator`."""
  spec = check_eval_args(pp=pp, batch_size=batch_size, process_index=process_index,
                         process_count=process_count)
  _check_pipeline(pipeline)
  from vit_jax.data import arrays  # pylint: disable=g-import-not-at-top
  if pipeline == 'auto' and arrays.serves(dataset, split, spec):
    return arrays.eval_iterator(dataset=dataset, split=split, batch_size=batch_size, spec=spec,
                                process_index=process_index, process_count=process_count)
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.eval_iterator(dataset=dataset, split=split, data_dir=data_dir,
                                batch_size=batch_size, spec=spec, process_index=process_index,
                                process_count=process_count, cache=cache)


def check_train_args(*, pp, batch_size, seed, start_step, process_index, process_count,
                     shuffle_buffer, sharding) -> specs.TrainSpec:
  """The train stream's arguments checked (UserError naming the bad one); the parsed spec."""
  if sharding not in SHARDINGS:
    raise UserError(f'unknown data_sharding {sharding!r}: use config.data_sharding=process or '
                    f'global')
  spec = specs.train_spec(pp)
  check_int('batch_size', batch_size, 1)
  check_int('start_step', start_step, 0)
  check_int('shuffle_buffer', shuffle_buffer, 1)
  check_int('seed', seed, -2**63)
  check_processes(process_index, process_count)
  return spec


def check_eval_args(*, pp, batch_size, process_index, process_count) -> specs.EvalSpec:
  """The eval batches' arguments checked (UserError naming the bad one); the parsed spec."""
  spec = specs.eval_spec(pp)
  check_int('batch_size', batch_size, 1)
  check_processes(process_index, process_count)
  return spec


def _check_pipeline(pipeline: str) -> None:
  if pipeline not in INPUT_PIPELINES:
    raise UserError(f"unknown input_pipeline {pipeline!r}: use config.input_pipeline=auto or "
                    f"tf.data")


def check_int(name: str, value, minimum: int) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise UserError(f'{name} must be an int >= {minimum}, got {value!r}')


def check_processes(process_index: int, process_count: int) -> None:
  check_int('process_count', process_count, 1)
  if not isinstance(process_index, (int, np.integer)) or not 0 <= process_index < process_count:
    raise UserError(f'process_index must be in [0, {process_count}), got {process_index!r}')


__all__ = ['check_eval_args', 'check_int', 'check_processes', 'check_train_args',
           'eval_iterator', 'train_iterator']
