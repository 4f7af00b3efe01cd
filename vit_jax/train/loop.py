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
from vit_jax import evaluate as evaluate_lib
from vit_jax import models
from vit_jax import parallel
from vit_jax.checkpoint import train_ckpt, transfer
from vit_jax.errors import UserError
from vit_jax.parallel import sharding
from vit_jax.train import logs, optim, polyak, step as step_lib, tasks


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
                             **{**config.model.to_dict(), **tasks.model_overrides(config)})


def _train_pp(config) -> dict:
  return dict(crop=config.pp.train_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, pad=config.pp.pad,
              flip=config.pp.flip, channels=config.pp.channels,
              randaug_layers=config.randaug.num_layers,
              randaug_magnitude=config.randaug.magnitude)


def _eval_pp(config) -> dict:
  return dict(crop=config.pp.eval_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, channels=config.pp.channels)


def _input_channels(config, info) -> int:
  return config.pp.channels or info.image_shape[-1]


def create_state(config, model, tx, mesh, image_shape, rng):
  """Initialises parameters and optimizer state directly in their final shardings."""

  def init(rng):
    dummy = jnp.zeros((1,) + tuple(image_shape), jnp.float32)
    params = model.init({'params': rng}, dummy, train=False)['params']
    return step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                               opt_state=tx.init(params))

  abstract = jax.eval_shape(init, rng)
  state_shardings = sharding.param_shardings(abstract, mesh)
  state = jax.jit(init, out_shardings=state_shardings)(rng)
  return state, state_shardings, abstract


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


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming from its newest checkpoint) and returns final eval."""
  os.makedirs(workdir, exist_ok=True)
  info = data_lib.get_info(config.dataset, config.data_dir)
  num_classes = tasks.num_outputs(config, config.num_classes or info.num_classes,
                                  _input_channels(config, info))
  num_train = info.num_examples(config.train_split)
  total_steps = resolve_steps(config, num_train)

  mesh = parallel.make_mesh(config.mesh)
  sharding.check_batch(config.batch_size, mesh)
  sharding.check_batch(config.eval_batch_size, mesh, 'eval_batch_size', 'eval_batch_size')
  local_batch = config.batch_size // jax.process_count()
  if (config.batch_size // mesh.devices.size) % config.accum_steps:
    raise UserError(f'the per-device batch {config.batch_size // mesh.devices.size} does not split '
                    f'into accum_steps={config.accum_steps} micro-batches: change '
                    '--config.accum_steps or --config.batch_size')

  if config.model.classifier == 'unpooled':
    raise UserError('config.model.classifier=unpooled gives per-token logits, which the trainer '
                    'cannot score: train with --config.model.classifier=token or gap')
  model = build_model(config, num_classes)
  schedule = optim.make_schedule(lr=config.lr, total_steps=total_steps,
                                 warmup_steps=config.warmup_steps, decay_type=config.decay_type,
                                 lr_end=config.lr_end)
  tx = optim.make_optimizer(config, schedule)
  image_shape = (config.image_size, config.image_size, _input_channels(config, info))

  rng = jax.random.PRNGKey(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  state, state_shardings, abstract = create_state(config, model, tx, mesh, image_shape, init_rng)

  ckpt = train_ckpt.Checkpointer(workdir, keep=config.keep_checkpoints)
  start_step = ckpt.latest_step() or 0
  if start_step:
    state, _ = ckpt.restore(start_step, train_ckpt.abstract_with_shardings(abstract,
                                                                           state_shardings))
    _say(f'resumed from {ckpt.directory} at step {start_step}')
  elif config.init:  # a new run from a pre-trained checkpoint (never over the run's own)
    state, source = transfer.initialise_state(
        config.init, state, model=model, image_size=config.image_size,
        method=config.init_posemb_resize, tx=tx, shardings=state_shardings)
    _say(f'initialised from {source}')

  batch_sh = sharding.batch_sharding(mesh)
  repl = sharding.replicated(mesh)
  train_step = step_lib.make_train_step(
      apply_fn=model.apply, tx=tx, loss_fn=tasks.loss_fn(config), num_classes=num_classes,
      label_smoothing=config.label_smoothing, accum_steps=config.accum_steps, schedule=schedule,
      objective=tasks.objective(config, model, num_classes))
  train_fn = jax.jit(train_step, in_shardings=(state_shardings, batch_sh, repl),
                     out_shardings=(state_shardings, repl), donate_argnums=(0,))
  eval_fn = jax.jit(tasks.eval_step(config, model, num_classes),
                    in_shardings=(state_shardings.params, batch_sh), out_shardings=repl)
  extra_evals = evaluate_lib.periodic_evaluators(
      config, model=model, mesh=mesh, param_shardings=state_shardings.params,
      eval_pp=_eval_pp(config))

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
        shuffle_buffer=config.shuffle_buffer, cache=config.cache, prefetch=config.prefetch)
    _say(f'training {config.model_name} on {config.dataset} ({num_train} examples) for '
         f'{total_steps} steps of batch {config.batch_size} on {mesh.devices.size} device(s)')
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
        result = evaluate(eval_fn, polyak.eval_params(state), eval_data, mesh)
        logger.write(step, 'eval', result)
        _say(f'\nstep {step}: eval {config.eval_split} {tasks.metric_name(config)} '
             f'{result["accuracy"]:.4f}, loss {result["loss"]:.4f} ({int(result["count"])} '
             'examples)')
      for name, extra in evaluate_lib.run_due(extra_evals, step, is_last,
                                              lambda: polyak.eval_params(state)):
        logger.write(step, name, extra)
        _say(f'step {step}: {name} ' + ' '.join(f'{k} {v:.4f}' for k, v in extra.items()))
      if step % config.checkpoint_every == 0 or is_last:
        ckpt.save(step, state, config_json)
    progress.close()
    elapsed = time.perf_counter() - t_start
    _say(f'trained steps {start_step + 1}-{total_steps} in {elapsed:.0f} s (compilation, '
         f'evaluation and checkpoints included)')
  else:
    _say(f'{workdir} already holds the final checkpoint (step {start_step}); evaluating it')
  if result is None:
    result = evaluate(eval_fn, polyak.eval_params(state), eval_data, mesh)
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
