"""Measuring this project's train step, forward pass and input pipeline, and the machine's matmul rate.

Every timing is device-synchronised (`block_until_ready`) and reported as the median of the timed
repetitions, after warm-up. FLOPs are the model's, counted from its shapes (`models.cost`): XLA's
cost analysis does not see what a GPU runs in cuBLAS and cuDNN, and counts a scanned encoder's
loop body once.
"""

import collections
import dataclasses
import re
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import data as data_lib
from vit_jax import tasks
from vit_jax.configs import common
from vit_jax.data import specs
from vit_jax.models import cost
from vit_jax.parallel import sharding
from vit_jax.platform import chips
from vit_jax.platform import targets
from vit_jax.train import program as program_lib

MATMUL_SIZE = chips.MATMUL_SIZE
SYNTHETIC_CHANNELS = 3  # the synthetic images are RGB


@dataclasses.dataclass
class Timing:
  seconds: List[float]           # per timed repetition

  @property
  def median(self) -> float:
    return statistics.median(self.seconds)


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> Timing:
  for _ in range(warmup):
    jax.block_until_ready(fn())
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - start)
  return Timing(out)


def matmul_peak_flops(repeats: int = 10, size: int = MATMUL_SIZE, dtype: str = 'float32') -> float:
  """FLOP/s of a large matrix multiply on the default device (the machine's matmul rate):
  `chips.measure_matmul_flops`."""
  return chips.measure_matmul_flops(dtype, size, repeats)


def device_peak_bytes() -> int:
  """The default device's allocator peak so far (GPU, TPU), 0 where JAX keeps none (CPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  return int(stats.get('peak_bytes_in_use', 0))


def minor_faults() -> int:
  """Minor page faults of this process so far (each step's fresh pages show up here)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model_flops(model, config, train: bool) -> float:
  """The model's FLOPs per image (`models.cost`): a train step's or a forward pass's."""
  shape = (config.image_size, config.image_size, SYNTHETIC_CHANNELS)
  return (cost.train_flops if train else cost.forward_flops)(model, shape)


def _memory(compiled) -> Dict[str, int]:
  """XLA's memory analysis of a compiled step, and its `peak`: arguments + outputs - aliased
  (donated) + temporaries."""
  m = compiled.memory_analysis()
  out = {k: int(getattr(m, f'{k}_size_in_bytes', 0)) for k in
         ('argument', 'output', 'alias', 'temp', 'generated_code')}
  out['peak'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  return out


def library_calls(hlo_text: str) -> Dict[str, int]:
  """How many times the compiled program calls each library kernel (custom-call target), e.g.
  {'__cublas$lt$matmul': 243, '__cublas$lt$matmul$f8': 36}: what XLA made of the step's dots
  (fp8 GEMMs where `model.fp8` is on and the GPU has them)."""
  return dict(collections.Counter(re.findall(r'custom_call_target="([^"]*)"', hlo_text)))


def set_benchmark_values(config, model_name: str, batch_size: int, image_size: int, dtype: str,
                         num_classes: int = 1000) -> None:
  """Turns a trainer config into a synthetic-data benchmark of `model_name` (no dataset read)."""
  with config.unlocked():
    config.model_name, config.num_classes, config.image_size = model_name, num_classes, image_size
    config.dataset, config.data_dir = 'synthetic', '/nonexistent'
    config.batch_size, config.eval_batch_size = batch_size, batch_size
    common.rgb_input(config)
    config.total_steps, config.total_epochs, config.warmup_steps = 1000, None, 10
    config.model.dtype = dtype
    config.mesh.data, config.mesh.fsdp, config.mesh.model = 1, 1, 1
    config.accum_steps = 1


def _synthetic_batch(batch_size: int, image_size: int, num_classes: int) -> Dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return {'image': rng.uniform(-1, 1, (batch_size, image_size, image_size, SYNTHETIC_CHANNELS)).astype(np.float32),
          'label': rng.integers(0, num_classes, batch_size).astype(np.int32)}


@dataclasses.dataclass
class Prepared:
  """A compiled step ready to be timed."""
  step: Callable[[], object]
  batch_size: int
  flops_per_step: float
  peak_bytes: int
  compile_s: float
  hlo_text: str = ''             # the compiled program (for vit_jax.tools.benchmarking.profile)
  memory: Optional[Dict[str, int]] = None  # `_memory`

  def measure(self, steps: int) -> dict:
    jax.block_until_ready(self.step())  # warm-up
    faults = minor_faults()
    timing = time_calls(self.step, steps, warmup=0)
    return {
        'minor_faults_per_step': (minor_faults() - faults) / steps,
        'img_per_s': self.batch_size / timing.median,
        'step_s': timing.median,
        'step_s_all': timing.seconds,
        'compile_s': self.compile_s,
        'flops_per_img': self.flops_per_step / self.batch_size,
        'achieved_flops': self.flops_per_step / timing.median,
        'peak_bytes': self.peak_bytes,
        'memory_analysis': self.memory,
        'device_peak_bytes': device_peak_bytes(),
        'rss_peak_bytes': rss_bytes(),
        'library_calls': library_calls(self.hlo_text),
    }


def prepare_train(config, devices: Optional[list] = None) -> Prepared:
  """The trainer's own jitted train step (the Program) on one synthetic batch, compiled (while
  the initial state is made, as in the trainer) and run once (compile_s: from the start to that
  first result)."""
  start = time.perf_counter()
  prog = program_lib.build_program(config, devices or jax.devices()[:1], require_dataset=False)
  future = prog.compile_train_step_in_background()  # as the trainer does: overlaps the init
  state = prog.init_state()
  batch = sharding.shard_batch(_synthetic_batch(config.batch_size, config.image_size,
                                                prog.num_classes), prog.mesh)
  compiled = future.result()
  holder = {'state': state}

  def step():
    holder['state'], metrics = compiled(holder['state'], batch, prog.dropout_rng, prog.hyper)
    return metrics

  jax.block_until_ready(step())
  seconds = time.perf_counter() - start
  flops = _model_flops(prog.model, config, train=True) * config.batch_size
  memory = _memory(compiled)
  return Prepared(step, config.batch_size, flops, memory['peak'], seconds, compiled.as_text(),
                  memory)


def _forward(config):
  """(model, init(rng, images) -> params, the jitted forward pass (params, images) -> logits) of
  the config's model, train=False."""
  model = tasks.get_task(config).build_model(config.num_classes)
  init = lambda r, images: model.init(r, images[:1], train=False)['params']
  return model, init, jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))


def prepare_infer(config) -> Prepared:
  """The forward pass (train=False) of the same model on one synthetic batch."""
  start = time.perf_counter()
  model, init, forward = _forward(config)
  images = jnp.asarray(_synthetic_batch(config.batch_size, config.image_size,
                                        config.num_classes)['image'])
  params = jax.jit(init)(jax.random.PRNGKey(0), images)
  compiled = forward.lower(params, images).compile()
  step = lambda: compiled(params, images)
  jax.block_until_ready(step())
  seconds = time.perf_counter() - start
  flops = _model_flops(model, config, train=False) * config.batch_size
  memory = _memory(compiled)
  return Prepared(step, config.batch_size, flops, memory['peak'], seconds, compiled.as_text(),
                  memory)


def compile_for(config, target: targets.Target, mode: str) -> dict:
  """Our train step (`mode` 'train') or forward pass compiled for one device of `target` (a
  device that is not here: vit_jax/platform/targets.py), not run: XLA's memory analysis,
  compile time, FLOPs."""
  start = time.perf_counter()
  devices, options = targets.devices(target)[:1], targets.compiler_options(target)
  abstract = lambda a, sharding=None: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
  if mode == 'train':
    prog = program_lib.build_program(config, devices, require_dataset=False)
    compiled = prog.train_fn.lower(*prog.abstract_train_args()).compile(compiler_options=options)
    model = prog.model
  else:
    model, init, forward = _forward(config)
    on = jax.sharding.SingleDeviceSharding(devices[0])
    images = jax.ShapeDtypeStruct((config.batch_size, config.image_size, config.image_size,
                                   SYNTHETIC_CHANNELS), jnp.float32, sharding=on)
    params = jax.tree.map(lambda a: abstract(a, on),
                          jax.eval_shape(init, jax.random.PRNGKey(0), images))
    compiled = forward.lower(params, images).compile(compiler_options=options)
  memory = _memory(compiled)
  return {'compile_s': time.perf_counter() - start, 'memory_analysis': memory,
          'peak_bytes': memory['peak'], 'device_kind': devices[0].device_kind,
          'flops_per_img': _model_flops(model, config, train=mode == 'train'),
          'library_calls': library_calls(compiled.as_text())}


def input_pipeline(config, data_dir: str, dataset: str, batches: int) -> dict:
  """img/s of the trainer's train input pipeline (the config's train preprocessing) on `dataset`."""
  start = time.perf_counter()
  it = data_lib.train_iterator(
      dataset=dataset, split='train', data_dir=data_dir, batch_size=config.batch_size,
      spec=specs.train_spec(config.pp.train, config.image_size), seed=0, shuffle_buffer=config.shuffle_buffer,
      cache=True, prefetch=config.prefetch)
  next(it)
  first_s = time.perf_counter() - start
  for _ in range(3):  # fill caches and autotuned buffers
    next(it)
  t0 = time.perf_counter()
  for _ in range(batches):
    next(it)
  seconds = time.perf_counter() - t0
  return {'img_per_s': batches * config.batch_size / seconds, 'compile_s': first_s,
          'step_s': seconds / batches, 'flops_per_img': 0.0, 'achieved_flops': 0.0,
          'peak_bytes': 0, 'device_peak_bytes': 0, 'rss_peak_bytes': rss_bytes()}


__all__ = ['matmul_peak_flops', 'device_peak_bytes', 'minor_faults', 'library_calls',
           'set_benchmark_values',
           'prepare_train',
           'prepare_infer', 'compile_for', 'input_pipeline', 'time_calls', 'Timing', 'Prepared']
