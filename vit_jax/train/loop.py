"""The one training loop, for pre-training and fine-tuning alike.

`program.build_program` (config checked; mesh, model, optimizer, shardings, jitted steps) ->
workdir checked, created and locked (a run refused before this point leaves no workdir) ->
born-sharded state (or the newest readable checkpoint, refusing a changed config or other array
shapes before reading it; the metrics log cut back to it) -> per-process batches -> train step
(donated state) -> metrics (JSONL, TensorBoard, progress line) -> periodic evaluation and
checkpoints -> learning-curve PNG. Returns the final evaluation metrics (with `compile_only`, the
per-device memory report; when preempted, {'preempted': True, 'step': N}).

Step N+1 is dispatched before step N's metrics are read. Every step's `nonfinite` flag is checked
(one step late, and before any checkpoint of that step), so no state after a NaN/Inf step is saved.
SIGTERM/SIGINT finish the current step, save it and return (see `guards.Preemption`); a second
Ctrl-C while that checkpoint is written waits for it, elsewhere it stops the run with one line
naming the checkpoint that stands (as does a metric log that cannot be written: disk full).
"""

import concurrent.futures
import dataclasses
import math
import sys
import time

import jax
import numpy as np

from vit_jax import data as data_lib
from vit_jax import evaluate as evaluate_lib
from vit_jax import parallel
from vit_jax.checkpoint import train_ckpt
from vit_jax.data import identity
from vit_jax.data import ops as ops_lib
from vit_jax.train import transfer
from vit_jax.errors import UserError
from vit_jax.parallel import memory
from vit_jax.run import feed as feed_lib
from vit_jax.run import guards
from vit_jax.run import lock as lock_lib
from vit_jax.run import logs
from vit_jax.train import patch_sizes
from vit_jax.train import polyak
from vit_jax.train import program as program_lib
from vit_jax.run import workdir as workdir_lib


def _mean_metrics(history: list) -> dict:
  fetched = jax.device_get(history)
  return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}


def train_and_evaluate(config, workdir: str, *, devices=None,
                       allow_config_change: bool = False, program=None) -> dict:
  """Trains `config` in `workdir` (resuming from its newest checkpoint) and returns final eval.

  `program`: the config's `program.build_program`, when the caller built it (the train command);
  else it is built here (the config validated once, the mesh over `devices`, default all devices
  of all processes). Resuming a workdir whose checkpoint was made with another config is refused
  unless `allow_config_change`; one whose arrays have other shapes is always refused. The run
  holds the workdir's lock (`lock.py`) from start to end: a second run on the same workdir stops
  at once.
  """
  prog = program or program_lib.build_program(config, devices)  # before the disk is touched
  if config.compile_only or config.compile_for:
    report = prog.memory_report()
    if jax.process_index() == 0:
      print(memory.format_report(report, prog.describe()), flush=True)
    if memory.fits(report) is False:
      raise UserError(f'{memory.fit_line(report)} ({prog.describe()}): try '
                      f'{memory.MEMORY_FIXES}')
    return report
  workdir_lib.check(workdir)  # the workdir's layout, before anything is created
  created = not workdir_lib.exists(workdir)
  workdir_lib.prepare(workdir)
  held = lock_lib.hold(workdir)  # a second run on the same workdir stops here
  ckpt = None
  try:
    with guards.Preemption() as preemption:
      ckpt = train_ckpt.Checkpointer(workdir, keep=config.keep_checkpoints)
      logger = None
      try:
        facts = run_facts(prog)
        start_step, state, train_fn = _start(prog, ckpt, workdir, allow_config_change, facts)
        logger = logs.MetricLogger(workdir, throughput=logs.throughput_for(
            prog.model, prog.image_shape, prog.config.batch_size, prog.mesh.devices.flat,
            prog.config.model.dtype))
        return _run(_Run(prog, ckpt, logger, preemption, workdir, facts), train_fn, state,
                    start_step)
      finally:
        try:
          if logger is not None:
            logger.close()
        finally:
          with preemption.saving():  # a save still being written is waited for
            ckpt.close()
  except (KeyboardInterrupt, logs.WriteError) as e:
    raise UserError(_stopped(e, ckpt)) from None
  finally:
    held.release()
    if created and jax.process_index() == 0:  # refused before it wrote anything: nothing left
      workdir_lib.remove_if_empty(workdir)


def _stopped(error: BaseException, ckpt) -> str:
  """The line for a run stopped by a Ctrl-C (the second one, or one while starting) or by a
  metric log it cannot write: what stands, and how to go on."""
  if ckpt is None:
    return 'interrupted (Ctrl-C) while starting: nothing was written; rerun the same command'
  point = ckpt.resume_point()
  resume = (f'{point} in {ckpt.directory} stands: rerun the same command to resume from it'
            if point != 'the start' else 'no checkpoint was written: rerun the same command')
  if isinstance(error, KeyboardInterrupt):
    return f'interrupted (Ctrl-C); {resume}'
  return f'{error}: free space or fix permissions there; {resume}'


def _start(prog, ckpt, workdir, allow_config_change, facts):
  """(start step, state, train step): the newest readable checkpoint (refusing one of another
  config or other shapes before its arrays are read), or a fresh state. The train step compiles
  on another thread (it is a future then) while the checkpoint's arrays are read, once its config
  and shapes are accepted, or while the initial state's programs compile and run."""
  abstract = train_ckpt.abstract_with_shardings(prog.abstract_state, prog.state_shardings)
  compiling = []  # the train step's future, started once a checkpoint is accepted

  def check(stored):
    notes = guards.refuse_mismatch(
        workdir, stored.step, stored_config=stored.config, config=prog.config.to_dict(),
        stored_facts=stored.facts, facts=facts,
        shape_changes=train_ckpt.shape_changes(stored, prog.abstract_state),
        allow_config_change=allow_config_change,
        data_changes=identity.changes((stored.facts or {}).get('data'), facts.get('data')))
    for note in notes:
      _say(note)
    if not compiling and stored.step < prog.total_steps:  # (a finished run trains no step)
      compiling.append(prog.compile_train_step_in_background())

  start_step, state, _ = ckpt.restore_latest(abstract, check)
  train_fn = compiling[0] if compiling else None
  if jax.process_index() == 0:  # the log's records after the start point are redone (or none)
    logs.repair_log(logs.metrics_path(workdir), start_step or 0)
  if start_step is None:
    pretrained = None
    if prog.config.init:  # a new run from a pre-trained checkpoint (never over the run's own)
      # Read and checked before anything compiles: a wrong path or model fails at once.
      pretrained = transfer.read_init(
          prog.config.init, prog.abstract_state.params, model=prog.model,
          image_size=prog.config.image_size, method=prog.config.init_posemb_resize)
    train_fn = train_fn or prog.compile_train_step_in_background()
    state = prog.init_state()
    if pretrained is not None:
      state = transfer.apply_init(pretrained, state, tx=prog.tx, shardings=prog.state_shardings)
      _say(f'initialised from {pretrained.source}')
    return 0, state, train_fn
  _say(f'resumed from {ckpt.directory} at step {start_step}')
  return start_step, state, train_fn


def run_facts(prog) -> dict:
  """What a checkpoint records of the data it was trained on (checked again on resume): the class
  count and input shape, and the dataset's class names, split sizes and fingerprint
  (`vit_jax.data.identity`; absent for a dataset that cannot be read), and the files that
  registered the preprocessing ops the config names outside vit_jax (`ops`; absent if none)."""
  facts = {'num_classes': int(prog.num_classes),
           'image_shape': [int(d) for d in prog.image_shape]}
  sources = ops_lib.OPS.sources(prog.pp.op_names())
  if sources:
    facts['ops'] = sources
  data = identity.identify(prog.data)
  if data is not None:
    facts['data'] = data
  return facts


@dataclasses.dataclass
class _Run:
  """What the loop of one run works with besides its state (made by `train_and_evaluate`)."""
  prog: program_lib.Program
  ckpt: train_ckpt.Checkpointer
  logger: logs.MetricLogger
  preemption: guards.Preemption
  workdir: str
  facts: dict  # what each checkpoint records of the data (`run_facts`)


def _run(run: _Run, train_fn, state, start_step: int) -> dict:
  """The loop; `train_fn` is the train step or the future of its compiled form (awaited once the
  data pipeline has started)."""
  prog, ckpt, logger = run.prog, run.ckpt, run.logger
  config, mesh, total_steps = prog.config, prog.mesh, prog.total_steps
  config_json, facts = config.to_dict(), run.facts
  evaluators = evaluate_lib.periodic_evaluators(config, evaluate_lib.Run(
      config=config, model=prog.model, mesh=mesh, param_shardings=prog.state_shardings.params,
      data=prog.data, eval_pp=prog.pp.eval, eval_fn=prog.eval_fn, task=prog.task))
  results = {}  # the newest metrics of each evaluator
  guard = _NumericsGuard(config.max_nonfinite_steps, int(jax.device_get(state.skipped)),
                         last_checkpoint=start_step or None)

  if start_step < total_steps:
    train_data = data_lib.train_iterator(
        info=prog.data, split=config.train_split,
        batch_size=prog.local_batch, spec=prog.pp.train, seed=config.seed, start_step=start_step,
        process_index=jax.process_index(), process_count=jax.process_count(),
        shuffle_buffer=config.shuffle_buffer, cache=config.cache, prefetch=config.prefetch,
        sharding=config.data_sharding)
    _say(f'training on {config.dataset} ({prog.num_train} examples) for {total_steps} steps on '
         f'{parallel.describe_run(mesh.devices.flat)}: {prog.describe()}')
    progress = logs.Progress(total_steps, start_step, config.batch_size, enabled=config.progress)
    pending = _PendingLog(logger, progress, guard)
    t_start = time.perf_counter()
    if isinstance(train_fn, concurrent.futures.Future):
      train_fn = train_fn.result()
    run.preemption.begin_training()  # a Ctrl-C until here stops the run, nothing trained
    history = []
    flexi_sizes = patch_sizes.of_config(config)  # FlexiViT: a patch size drawn per step
    feed = feed_lib.Feed(train_data)
    try:
      for step in range(start_step + 1, total_steps + 1):
        batch = feed.next(lambda: run.preemption.requested)
        if batch is None:  # a signal while the input had no batch ready: step - 1 is the last
          return _stop_waiting(run, state, step - 1, history, pending, guard, progress)
        batch = parallel.shard_batch(batch, mesh)
        step_fn = train_fn
        if flexi_sizes[0]:  # the model's own patch size keeps the step compiled at the start
          patch = patch_sizes.draw(*flexi_sizes, config.seed, step)
          step_fn = train_fn if patch == prog.model.patch[0] else prog.train_fn_at(patch)
        state, metrics = step_fn(state, batch, prog.dropout_rng, prog.hyper)
        guard.check_previous_then_hold(step, metrics)
        history.append(metrics)
        pending.flush()  # step N-1's metrics are read only after step N is dispatched
        if step == start_step + 1:
          jax.block_until_ready(metrics)
          progress.restart_clock(step)
        is_last = step == total_steps
        stop = run.preemption.should_stop(step) and not is_last
        if step % config.log_every == 0 or is_last or stop:  # the stop save logs its steps too
          pending.hold(step, history)
          history = []
        due = evaluate_lib.run_due(evaluators, step, is_last, lambda: polyak.eval_params(state))
        for scheduled, metrics in due:
          guard.check_held()  # (no evaluation of a state after a non-finite step)
          pending.flush()
          logger.write(step, scheduled.name, metrics)
          _say(('\n' if scheduled.type == 'top1' else '') + scheduled.line(step, metrics))
          results[scheduled.name] = metrics
        if step % config.checkpoint_every == 0 or is_last or stop:
          guard.check_held()
          pending.flush()  # the log has every step the checkpoint has (log write errors)
          with run.preemption.saving():  # a second Ctrl-C while it is written waits for it
            ckpt.save(step, state, config_json, facts)
            if stop:
              ckpt.wait()
          guard.last_checkpoint = step
        if stop:
          progress.close()
          _say(f'\npreempted: saved the checkpoint of step {step} in {ckpt.directory}; rerun the '
               f'same command to resume')
          return {'preempted': True, 'step': step}
    finally:
      feed.close()  # its helper thread ends and lets go of the input pipeline
    progress.close()
    elapsed = time.perf_counter() - t_start
    _say(f'trained steps {start_step + 1}-{total_steps} in {elapsed:.0f} s (compilation, '
         f'evaluation and checkpoints included)')
  else:
    _say(f'{run.workdir} already holds the final checkpoint (step {start_step}); evaluating it')
  if not results:  # the run was finished: its top-1 evaluators once more
    results = {e.name: e.evaluation.evaluate(polyak.eval_params(state))
               for e in evaluators if e.type == 'top1'}
  ckpt.wait()
  if jax.process_index() == 0:
    logs.plot_learning_curve(logs.metrics_path(run.workdir),
                             f'{run.workdir.rstrip("/")}/learning_curve.png')
  return _final(results)


def _final(results: dict) -> dict:
  """What a run returns: the metrics of its `eval` entry (the eval split's top-1), else of its
  first evaluator by name ({} without any)."""
  if 'eval' in results:
    return results['eval']
  return results[sorted(results)[0]] if results else {}


def _stop_waiting(run: _Run, state, last: int, history: list, pending, guard, progress) -> dict:
  """A stop asked for while the input pipeline had no batch ready (its reads blocked): the
  records and checkpoint of the last step trained (unless it is on disk already), then the
  usual line."""
  guard.check_held()  # the last step's numbers, before its checkpoint
  if history:
    pending.hold(last, history)
  pending.flush()
  progress.close()
  if last > (guard.last_checkpoint or 0):
    with run.preemption.saving():
      run.ckpt.save(last, state, run.prog.config.to_dict(), run.facts)
      run.ckpt.wait()
  if last == 0:
    _say('\npreempted before the first step, while waiting for the input: nothing to save; '
         'rerun the same command to start')
  else:
    _say(f'\npreempted while waiting for the input: saved the checkpoint of step {last} in '
         f'{run.ckpt.directory}; rerun the same command to resume')
  return {'preempted': True, 'step': last}


class _PendingLog:
  """The train metrics of the last logged step, written one step late (so reading them never
  stalls the device) or at once before an eval or a checkpoint: the one place they are flushed."""

  def __init__(self, logger, progress, guard):
    self._logger, self._progress, self._guard = logger, progress, guard
    self._held = None

  def hold(self, step: int, history: list) -> None:
    self._held = (step, history)

  def flush(self) -> None:
    if self._held is None:
      return
    step, history = self._held
    self._held = None
    metrics = _mean_metrics(history)
    metrics['skipped'] = float(self._guard.skipped)
    self._logger.write(step, 'train', metrics)
    if math.isfinite(metrics['loss']):
      self._progress.update(step, metrics['loss'])


class _NumericsGuard:
  """Checks each step's `nonfinite` flag one step late (or at once before a save or eval)."""

  def __init__(self, max_skipped: int, skipped: int, last_checkpoint):
    self.max_skipped, self.skipped, self.last_checkpoint = max_skipped, skipped, last_checkpoint
    self._held = None

  def check_previous_then_hold(self, step: int, metrics) -> None:
    self.check_held()
    self._held = (step, metrics)

  def check_held(self) -> None:
    if self._held is None:
      return
    step, metrics = self._held
    self._held = None
    if float(metrics['nonfinite']):
      self.skipped += 1
      values = {k: float(metrics[k]) for k in ('loss', 'grad_norm', 'nonfinite')}
      guards.check_finite(step, values, self.last_checkpoint, self.skipped, self.max_skipped)


def _say(message: str) -> None:
  if jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


__all__ = ['train_and_evaluate']
