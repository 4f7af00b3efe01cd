"""The one training loop, for pre-training and fine-tuning alike.

config -> mesh -> born-sharded state (or the newest checkpoint) -> per-process batches -> jitted
train step (donated state) -> metrics (JSONL, TensorBoard, progress line) -> periodic evaluation and
checkpoints -> learning-curve PNG. Returns the final evaluation metrics.
"""

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import data as data_lib
from vit_jax import models
from vit_jax import parallel
from vit_jax.checkpoint import train_ckpt
from vit_jax.errors import UserError
from vit_jax.parallel import memory
from vit_jax.parallel import sharding
from vit_jax.parallel import steps as steps_lib
from vit_jax.train import logs, losses, optim, step as step_lib


def resolve_steps(config, num_train_examples: int) -> int:
  """Total steps from `total_steps` or `total_epochs` (exactly one of them must be set)."""
  if (config.total_steps is None) == (config.total_epochs is None):
    raise UserError('set exactly one of --config.total_steps and --config.total_epochs')
  if config.total_steps is not None:
    steps = config.total_steps
  else:
    steps = math.ceil(config.total_epochs * num_train_examples / config.batch_size)
  if steps <= 0:
    raise UserError(f'the run has {steps} steps: raise --config.total_steps/total_epochs')
  return steps


def build_model(config, num_classes: int):
  return models.create_model(config.model_name, num_classes=num_classes,
                             **config.model.to_dict())


def _train_pp(config) -> dict:
  return dict(crop=config.pp.train_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, pad=config.pp.pad,
              flip=config.pp.flip, channels=config.pp.channels)


def _eval_pp(config) -> dict:
  return dict(crop=config.pp.eval_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, channels=config.pp.channels)


def _input_channels(config, info) -> int:
  return config.pp.channels or info.image_shape[-1]


def _init_fn(model, tx, image_shape, rng):
  """(init(rng) -> TrainState, its abstract shapes): parameters are never built unsharded."""

  def init(rng):
    dummy = jnp.zeros((1,) + tuple(image_shape), jnp.float32)
    params = model.init({'params': rng}, dummy, train=False)['params']
    return step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                               opt_state=tx.init(params))

  return init, jax.eval_shape(init, rng)


def create_state(model, tx, mesh, image_shape, rng):
  """Initialises parameters and optimizer state directly in their final shardings."""
  init, abstract = _init_fn(model, tx, image_shape, rng)
  state_shardings = sharding.param_shardings(abstract, mesh)
  return jax.jit(init, out_shardings=state_shardings)(rng), state_shardings, abstract


def _check_tensor_parallel(model, mesh) -> None:
  ways = mesh.shape['model']
  if ways > 1 and (getattr(model, 'num_heads', 0) % ways or getattr(model, 'mlp_dim', 0) % ways):
    raise UserError(f'mesh.model={ways} does not divide the {model.num_heads} attention heads and '
                    f'MLP width {model.mlp_dim} of this model: use a mesh.model that divides both')


def _describe_mesh(parallelism: str, mesh) -> str:
  shape = ' x '.join(f'{k} {v}' for k, v in mesh.shape.items())
  return f'{parallelism}, mesh {shape}'


def _compile_only(config, train_fn, abstract, state_shardings, mesh, image_shape, rng) -> dict:
  batch_sh = sharding.batch_sharding(mesh)
  batch = {'image': jax.ShapeDtypeStruct((config.batch_size, *image_shape), jnp.float32,
                                         sharding=batch_sh),
           'label': jax.ShapeDtypeStruct((config.batch_size,), jnp.int32, sharding=batch_sh)}
  report = memory.compiled_step_report(train_fn, abstract, state_shardings, batch, rng)
  what = (f'{config.model_name} at {config.image_size} px, batch {config.batch_size}'
          f'{f" (accum_steps {config.accum_steps})" if config.accum_steps > 1 else ""}, '
          f'{_describe_mesh(config.parallelism, mesh)}, remat {config.model.remat}, '
          f'dtype {config.model.dtype}')
  if jax.process_index() == 0:
    print(memory.format_report(report, what), flush=True)
  return report


def evaluate(eval_fn, params, eval_data, mesh) -> dict:
  batches, _ = eval_data
  totals = None
  for batch in batches:
    out = eval_fn(params, parallel.shard_batch(batch, mesh))
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  totals = jax.device_get(totals)
  count = float(totals['count'])
  return {'accuracy': float(totals['correct']) / count, 'loss': float(totals['loss']) / count,
          'count': count}


def _mean_metrics(history: list) -> dict:
  fetched = jax.device_get(history)
  return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}


def _dataset_facts(config):
  """(num_classes, train examples, input channels) of the configured dataset.

  In compile-only mode a dataset that is not prepared here is fine when `num_classes` is set
  (channels from `pp.channels`, else 3; one epoch counts as zero examples).
  """
  try:
    info = data_lib.get_info(config.dataset, config.data_dir)
  except UserError:
    if not (config.compile_only and config.num_classes):
      raise
    return config.num_classes, 0, config.pp.channels or 3
  return (config.num_classes or info.num_classes, info.num_examples(config.train_split),
          _input_channels(config, info))


def train_and_evaluate(config, workdir: str, *, devices=None) -> dict:
  """Trains `config` in `workdir` (resuming from its newest checkpoint) and returns final eval.

  `devices` (default: all devices of all processes) is what the mesh is built over; with
  `config.compile_only` it returns the compiled train step's per-device memory report instead.
  """
  num_classes, num_train, channels = _dataset_facts(config)
  total_steps = resolve_steps(config, num_train) if not config.compile_only or num_train else 1

  mesh = parallel.make_mesh(config.mesh, devices)
  steps_lib.check_parallelism(config.parallelism, mesh)
  sharding.check_batch(config.batch_size, mesh)
  sharding.check_batch(config.eval_batch_size, mesh, 'eval_batch_size', 'eval_batch_size')
  local_batch = config.batch_size // jax.process_count()
  shard_rows = config.batch_size // sharding.batch_devices(mesh)
  if shard_rows % config.accum_steps:
    raise UserError(f'the per-device batch {shard_rows} does not split into '
                    f'accum_steps={config.accum_steps} micro-batches: change '
                    '--config.accum_steps or --config.batch_size')

  if config.model.classifier == 'unpooled':
    raise UserError('config.model.classifier=unpooled gives per-token logits, which the trainer '
                    'cannot score: train with --config.model.classifier=token or gap')
  model = build_model(config, num_classes)
  _check_tensor_parallel(model, mesh)
  schedule = optim.make_schedule(lr=config.lr, total_steps=total_steps,
                                 warmup_steps=config.warmup_steps, decay_type=config.decay_type,
                                 lr_end=config.lr_end)
  tx = optim.make_optimizer(config, schedule)
  loss_fn = losses.get_loss(config.loss)
  image_shape = (config.image_size, config.image_size, channels)

  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  init_fn, abstract = _init_fn(model, tx, image_shape, init_rng)
  state_shardings = sharding.param_shardings(abstract, mesh)

  train_step = step_lib.make_train_step(
      apply_fn=model.apply, tx=tx, loss_fn=loss_fn, num_classes=num_classes,
      label_smoothing=config.label_smoothing, accum_steps=config.accum_steps, schedule=schedule,
      reduce_axis=steps_lib.reduce_axis(config.parallelism))
  train_fn = steps_lib.compile_train_step(train_step, config.parallelism, mesh, state_shardings)
  eval_fn = steps_lib.compile_eval_step(
      step_lib.make_eval_step(apply_fn=model.apply, loss_fn=loss_fn, num_classes=num_classes),
      mesh, state_shardings.params)

  if config.compile_only:
    return _compile_only(config, train_fn, abstract, state_shardings, mesh, image_shape,
                         dropout_rng)

  os.makedirs(workdir, exist_ok=True)
  state = jax.jit(init_fn, out_shardings=state_shardings)(init_rng)
  ckpt = train_ckpt.Checkpointer(workdir, keep=config.keep_checkpoints)
  start_step = ckpt.latest_step() or 0
  if start_step:
    state, _ = ckpt.restore(start_step, train_ckpt.abstract_with_shardings(abstract,
                                                                           state_shardings))
    _say(f'resumed from {ckpt.directory} at step {start_step}')

  eval_data = data_lib.eval_iterator(
      dataset=config.dataset, split=config.eval_split, data_dir=config.data_dir,
      batch_size=config.eval_batch_size // jax.process_count(), pp=_eval_pp(config),
      process_index=jax.process_index(), process_count=jax.process_count(), cache=config.cache)
  logger = logs.MetricLogger(workdir)
  config_json = config.to_dict()
  result = None

  if start_step < total_steps:
    train_data = data_lib.train_iterator(
        dataset=config.dataset, split=config.train_split, data_dir=config.data_dir,
        batch_size=local_batch, pp=_train_pp(config), seed=config.seed, start_step=start_step,
        process_index=jax.process_index(), process_count=jax.process_count(),
        shuffle_buffer=config.shuffle_buffer, cache=config.cache, prefetch=config.prefetch,
        sharding=config.data_sharding)
    _say(f'training {config.model_name} on {config.dataset} ({num_train} examples) for '
         f'{total_steps} steps of batch {config.batch_size} on {mesh.devices.size} device(s) '
         f'({_describe_mesh(config.parallelism, mesh)})')
    progress = logs.Progress(total_steps, start_step, config.batch_size, enabled=config.progress)
    t_start = time.perf_counter()
    history, to_log = [], None
    for step in range(start_step + 1, total_steps + 1):
      batch = parallel.shard_batch(next(train_data), mesh)
      state, metrics = train_fn(state, batch, dropout_rng)
      history.append(metrics)
      if to_log is not None:  # read step N-1's metrics only after step N is dispatched
        _log_train(logger, progress, *to_log)
        to_log = None
      if step == start_step + 1:
        jax.block_until_ready(metrics)
        progress.restart_clock(step)
      if step % config.log_every == 0 or step == total_steps:
        to_log, history = (step, history), []
      is_last = step == total_steps
      if step % config.eval_every == 0 or is_last:
        if to_log is not None:
          _log_train(logger, progress, *to_log)
          to_log = None
        result = evaluate(eval_fn, state.params, eval_data, mesh)
        logger.write(step, 'eval', result)
        _say(f'\nstep {step}: eval {config.eval_split} top-1 {result["accuracy"]:.4f} '
             f'loss {result["loss"]:.4f} ({int(result["count"])} examples)')
      if step % config.checkpoint_every == 0 or is_last:
        ckpt.save(step, state, config_json)
    progress.close()
    elapsed = time.perf_counter() - t_start
    _say(f'trained steps {start_step + 1}-{total_steps} in {elapsed:.0f} s (compilation, '
         f'evaluation and checkpoints included)')
  else:
    _say(f'{workdir} already holds the final checkpoint (step {start_step}); evaluating it')
  if result is None:
    result = evaluate(eval_fn, state.params, eval_data, mesh)
  ckpt.close()
  logger.close()
  if jax.process_index() == 0:
    logs.plot_learning_curve(logger.path, os.path.join(workdir, 'learning_curve.png'))
  return result


def _log_train(logger, progress, step, history):
  metrics = _mean_metrics(history)
  if not all(math.isfinite(v) for v in metrics.values()):
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    raise FloatingPointError(f'non-finite {", ".join(bad)} in the steps up to {step}')
  logger.write(step, 'train', metrics)
  progress.update(step, metrics['loss'])


def _say(message: str) -> None:
  if jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


__all__ = ['train_and_evaluate', 'resolve_steps', 'build_model', 'create_state', 'evaluate']
