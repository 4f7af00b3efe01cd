"""What a config compiles to, before any data is read or parameter allocated: the `Program`.

`build_program(config, devices)` resolves the dataset facts and the step count, builds the mesh,
the model, the optimizer, the abstract train state and its shardings (parameters
are born sharded from `init_fn`), and the jitted train and eval steps of the chosen parallel path.
The run's task (`tasks.Task`) and parsed preprocessing (`specs.Preprocessing`) come from the
config's one validation and ride on the program.
The training loop runs it; `compile_only` and the benchmarks compile it without training.
"""

import concurrent.futures
import dataclasses
import functools
import math
import os
import sys
from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from vit_jax import data as data_lib
from vit_jax.data import specs
from vit_jax import models
from vit_jax import parallel
from vit_jax.errors import UserError
from vit_jax.models import cost
from vit_jax.models import fp8 as fp8_lib
from vit_jax.models import vit
from vit_jax.parallel import memory
from vit_jax.parallel import sharding
from vit_jax.parallel import steps as steps_lib
from vit_jax.platform import chips
from vit_jax.platform import estimate
from vit_jax.platform import targets
from vit_jax import tasks
from vit_jax.train import optim, step as step_lib, validate


@dataclasses.dataclass
class Program:
  """Everything `train_and_evaluate` needs besides data, checkpoints and logs."""
  config: Any
  mesh: jax.sharding.Mesh
  model: Any
  task: tasks.Task           # what the run optimises and how it is scored
  pp: specs.Preprocessing    # the train and eval op lists, parsed once by the validation
  tx: Any                    # the optax transformation (its state is part of the train state)
  num_classes: int           # outputs of the head (masked patch prediction: colour classes)
  num_train: int             # train examples (0 if the dataset is absent in compile-only mode)
  data: Any                  # the dataset's `data.DatasetInfo`, resolved once (None if absent)
  total_steps: int
  image_shape: Tuple[int, int, int]
  hyper: dict                # the train step's last argument (optim.hyperparameters)
  init_fn: 'Init'            # init(rng) -> TrainState
  init_rng: jax.Array
  dropout_rng: jax.Array
  abstract_state: Any        # ShapeDtypeStructs of the TrainState
  state_shardings: Any
  train_fn: Callable         # jitted (state, global batch, rng, hyper) -> (state, metrics)
  eval_fn: Callable          # jitted (params, global batch) -> sums
  target: Optional[targets.Target] = None  # the TPU slice or GPU compiled for (compile_for)
  train_fn_for: Optional[Callable] = None  # model -> its jitted train step (as `train_fn`)
  _train_fns: dict = dataclasses.field(default_factory=dict)  # FlexiViT: patch size -> step

  def train_fn_at(self, patch_size: int) -> Callable:
    """The jitted train step of the model run at `patch_size` (FlexiViT training: the same
    state, one compiled step per patch size, each built once)."""
    if patch_size not in self._train_fns:
      self._train_fns[patch_size] = self.train_fn_for(
          self.model.clone(patch_size=(patch_size, patch_size)))
    return self._train_fns[patch_size]

  @property
  def local_batch(self) -> int:
    return self.config.batch_size // jax.process_count()

  def init_state(self):
    """The initial train state, created directly in its shardings (no parameter is ever whole
    on one device first)."""
    return jax.jit(self.init_fn, out_shardings=self.state_shardings)(self.init_rng)

  def compile_train_step_in_background(self) -> concurrent.futures.Future:
    """Starts compiling the train step for the state and batch shapes on another thread; the
    future's result is the compiled step, called like `train_fn`. Started before `init_state`,
    the two compilations overlap on a multi-core host."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='compile_train_step')
    future = pool.submit(lambda: self.train_fn.lower(*self.abstract_train_args()).compile())
    pool.shutdown(wait=False)
    return future

  def abstract_train_args(self) -> tuple:
    """The train step's arguments as shapes (to lower it): the rng and hyperparameters take the
    step's replicated shardings, so it lowers for devices that are not here too."""
    shape = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    return (self.abstract_state, self.abstract_batch(), shape(self.dropout_rng),
            jax.tree.map(shape, self.hyper))

  def abstract_batch(self) -> dict:
    sh = sharding.batch_sharding(self.mesh)
    b = self.config.batch_size
    return {'image': jax.ShapeDtypeStruct((b, *self.image_shape), jnp.float32, sharding=sh),
            'label': jax.ShapeDtypeStruct((b,), jnp.int32, sharding=sh)}

  def describe(self) -> str:
    c = self.config
    mesh = ' x '.join(f'{k} {v}' for k, v in self.mesh.shape.items())
    accum = f' (accum_steps {c.accum_steps})' if c.accum_steps > 1 else ''
    return (f'{c.model_name} at {c.image_size} px, batch {c.batch_size}{accum}, '
            f'{c.parallelism}, mesh {mesh}, remat {c.model.remat}, dtype {c.model.dtype}'
            + (', scanned encoder' if c.model.scan else ''))

  def abstract_eval_batch(self) -> dict:
    sh = sharding.batch_sharding(self.mesh)
    b = self.config.eval_batch_size
    return {'image': jax.ShapeDtypeStruct((b, *self.image_shape), jnp.float32, sharding=sh),
            'label': jax.ShapeDtypeStruct((b,), jnp.int32, sharding=sh),
            'mask': jax.ShapeDtypeStruct((b,), jnp.float32, sharding=sh)}

  def memory_report(self) -> dict:
    """Per-device bytes, FLOPs and compile times of the compiled train and eval steps, by the
    compiler of the mesh's devices (nothing is run or allocated). FLOPs are None where XLA's
    count would be short (`flops_missing` says why, `memory.FLOPS_MISSING`)."""
    report = memory.program_report(self)
    # XLA's cost analysis counts a loop's body once, so a scanned encoder's figure would be a
    # fraction of the step's; on a GPU it misses the library calls (the GEMMs).
    missing = 'scan' if self.config.model.get('scan') else (
        'gpu' if report['platform'] == 'gpu' else None)
    if missing:
      report['flops'] = report['eval']['flops'] = None
      report['flops_missing'] = missing
    if self.target is not None:
      report['target'] = self.target.describe()
    if report['platform'] == 'tpu':
      report['estimate'] = self.estimate(report)
    return report

  def estimate(self, report: dict) -> dict:
    """The TPU compiler's estimated train and eval step times (vit_jax/platform/estimate.py) of
    a `memory_report` (or of the train step's `memory.step_stats` with `devices`: no eval), and of a run of known length (`total_steps` set, or the dataset's size
    known) its train steps' wall time; {'missing': why} where the estimate would be short."""
    if self.config.model.get('scan'):
      return {'missing': 'scan'}
    c, devices = self.config, report['devices']
    chip = self.target.chip if self.target is not None else chips.find_chip(
        self.mesh.devices.flat[0].device_kind)
    attention = cost.attention_flops(self.model, self.image_shape)  # forward, per image
    out = {
        'train': estimate.step(report, c.batch_size / devices, chip,
                               3 * attention * c.batch_size / devices),
        'eval': report.get('eval') and estimate.step(
            report['eval'], c.eval_batch_size / devices, chip,
            attention * c.eval_batch_size / devices),
    }
    if out['train'] is not None and (self.num_train or c.total_steps):
      out['steps'] = self.total_steps
      out['run_seconds'] = self.total_steps * out['train']['seconds']
    return out


def resolve_steps(config, num_train_examples: int) -> int:
  """Total steps from `total_steps` or `total_epochs` (exactly one of them must be set)."""
  if (config.total_steps is None) == (config.total_epochs is None):
    raise UserError('set exactly one of config.total_steps and config.total_epochs')
  if config.total_steps is not None:
    steps = config.total_steps
  else:
    steps = math.ceil(config.total_epochs * num_train_examples / config.batch_size)
  if steps <= 0:
    raise UserError(f'the run has {steps} steps: raise config.total_steps/total_epochs')
  return steps


def dataset_facts(config, task: tasks.Task, pp: specs.Preprocessing,
                  require_dataset: bool = True, info=None):
  """(num_classes, train examples, input channels, the dataset's info) of the configured dataset
  for `task`.

  The info (`data.get_info`: an embedded dataset's without TensorFlow) is looked up here once per
  run and passed on to the pipelines, the evaluators and the checkpoint's record of the data.
  Without `require_dataset` (compile-only, benchmarks) a dataset that is not prepared here is
  fine when `num_classes` is set (channels from the train ops, else 3; 0 train examples; no
  info). The channels are what the train preprocessing gives (`pp.input_channels`).
  `info`: the info already looked up (the train command does, before JAX loads).
  """
  try:
    info = info or data_lib.get_info(config.dataset, config.data_dir)
  except UserError:
    if require_dataset or not config.num_classes:
      raise
    return config.num_classes, 0, pp.input_channels(None), None
  return (head_width(config, info.num_classes, task), info.num_examples(config.train_split),
          pp.input_channels(info.image_shape[-1]), info)


def head_width(config, dataset_classes: int, task: tasks.Task) -> int:
  """The classifier's outputs: the dataset's class count, or `num_classes` where it is meaningful.

  Fewer outputs than classes would leave labels without an output (a silently wrong run): a
  UserError. More is allowed (a head sized for classes still to come, or matching another
  model's), and said on stderr: the extra outputs are never a target.
  """
  n = config.num_classes
  if not n or n == dataset_classes or not task.uses_labels:
    return n or dataset_classes
  if n < dataset_classes:
    raise UserError(f'config.num_classes={n} is fewer than the {dataset_classes} classes of '
                    f'{config.dataset}: labels {n}..{dataset_classes - 1} would have no output; '
                    f'leave num_classes unset (it is read from the dataset) or set it >= '
                    f'{dataset_classes}')
  if jax.process_index() == 0:
    print(f'note: the head has num_classes={n} outputs for the {dataset_classes} classes of '
          f'{config.dataset}; outputs {dataset_classes}..{n - 1} are never a target',
          file=sys.stderr, flush=True)
  return n


@dataclasses.dataclass(eq=False)
class Init:
  """The initial train state of `model` and `tx` for images of `image_shape`.

  `init(rng)` is traceable: jitted with the state's shardings, parameters are never built
  unsharded. With `mesh`, it traces under the mesh's activation rules, as the steps do
  (`model.attention=auto|flash` resolved for its platform, e.g. TPU from a CPU host).
  """
  model: Any
  tx: Any
  image_shape: Tuple[int, ...]
  mesh: Optional[jax.sharding.Mesh] = None
  __name__ = 'init'  # what jit names the program ('jit_init')

  def _under_mesh(self, fn: Callable) -> Callable:
    return fn if self.mesh is None else sharding.with_activation_sharding(fn, self.mesh)

  def _state(self, variables):
    params, fp8 = fp8_lib.split(variables)
    return step_lib.TrainState.create(params, self.tx, fp8)

  def __call__(self, rng):
    def init(rng):
      dummy = jnp.zeros((1, *self.image_shape), jnp.float32)
      return self._state(self.model.init({'params': rng}, dummy, train=False))
    return self._under_mesh(init)(rng)


def init_fn_and_shapes(model, tx, image_shape, rng, mesh=None):
  """(`Init`, the abstract shapes of the state it makes)."""
  init = Init(model, tx, tuple(image_shape), mesh)
  return init, jax.eval_shape(init, rng)


def _check_mesh(config, mesh) -> None:
  steps_lib.check_parallelism(config.parallelism, mesh)
  sharding.check_batch(config.batch_size, mesh)
  sharding.check_batch(config.eval_batch_size, mesh, 'eval_batch_size', 'eval_batch_size')
  shard_rows = config.batch_size // sharding.batch_devices(mesh)
  if shard_rows % config.accum_steps:
    raise UserError(f'the per-device batch {shard_rows} does not split into '
                    f'accum_steps={config.accum_steps} micro-batches: change '
                    'config.accum_steps or config.batch_size')


def _check_tensor_parallel(model, mesh) -> None:
  ways = mesh.shape['model']
  if ways > 1 and (getattr(model, 'num_heads', 0) % ways or getattr(model, 'mlp_dim', 0) % ways):
    raise UserError(f'mesh.model={ways} does not divide the {model.num_heads} attention heads and '
                    f'MLP width {model.mlp_dim} of this model: use a mesh.model that divides both')


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a program runs: its mesh, and the TPU slice or GPU it is compiled for
  (`config.compile_for`) or None."""
  mesh: jax.sharding.Mesh
  target: Optional[targets.Target] = None


def _check_input_size(config) -> None:
  """The image size against the variant's patches (a hybrid's: after its ResNet stem), from the
  variant table alone; a BiT takes any size."""
  cls, kwargs = models.decode(config.model_name)
  if cls is models.VisionTransformer:
    vit.check_image_size(config.image_size, config.image_size, **kwargs)


# Test-only: `model.fp8` on devices without fp8 matmuls (XLA:CPU computes the fp8 dots in float32,
# so the tests check fp8 training's numerics on any machine; it says nothing of its speed).
FP8_EMULATION_FOR_TESTS = 'VIT_JAX_FP8_EMULATION_FOR_TESTS'


def check_fp8(config, devices) -> None:
  """A UserError if `config.model.fp8` is set and some device of the run has no fp8 matmuls
  (`chips.fp8_support`: NVIDIA compute capability >= 8.9)."""
  if not config.model.get('fp8') or os.environ.get(FP8_EMULATION_FOR_TESTS) == '1':
    return
  reasons = sorted({r for r in map(chips.fp8_support, devices) if r})
  if reasons:
    raise UserError(f'config.model.fp8=True needs an NVIDIA GPU with fp8 tensor cores (compute '
                    f'capability >= 8.9: H100, H200, L4, ...), but {reasons[0]}: set '
                    f'config.model.fp8=False (or train on such a GPU)')


def check_placement(config, devices: Optional[list] = None) -> Placement:
  """The mesh of a validated config over `devices` (default: all; with `config.compile_for`, that
  TPU slice's or GPU's), checked against the batch sizes and micro-batches, the devices against
  `model.fp8`, and the image size against the variant: every mistake found without the dataset,
  so before TensorFlow is imported. `build_program` starts with it."""
  target = targets.parse(config.compile_for) if config.compile_for else None
  if target is not None:
    devices = targets.devices(target)
  check_fp8(config, devices if devices is not None else jax.devices())
  mesh = parallel.make_mesh(config.mesh, devices)
  _check_mesh(config, mesh)
  _check_input_size(config)
  return Placement(mesh, target)


def build_program(config, devices: Optional[list] = None, *,
                  require_dataset: Optional[bool] = None,
                  checked: Optional[validate.Checked] = None, info=None) -> Program:
  """Resolves and compiles (lazily, at first call) everything a config describes, building the
  mesh and the model once.

  The config is validated first (`validate.check_config`, which resolves the run's task and
  parses its preprocessing) unless the caller did and passes what it returned, `checked` (the
  train command, before it joins a distributed run), and likewise the dataset's `info`.
  `require_dataset` (default: not in compile-only mode) says whether the dataset must exist. With
  `config.compile_for` the devices are that TPU slice's or GPU's, described by its compiler
  (`vit_jax/platform/targets.py`): the program can be compiled, not run.
  """
  if checked is None:
    checked = validate.check_config(config)
  task = checked.task
  placement = check_placement(config, devices)
  mesh = placement.mesh
  if require_dataset is None:
    require_dataset = not (config.compile_only or config.compile_for)
  num_classes, num_train, channels, data = dataset_facts(config, task, checked.pp,
                                                         require_dataset, info)
  num_classes = task.num_outputs(num_classes, channels)  # masked patch prediction: 8**C
  # Compile-only without the dataset: epochs cannot be counted, and the step count is only an
  # argument of the compiled step (the learning-rate schedule's length).
  total_steps = (resolve_steps(config, num_train) if num_train or config.total_steps
                 else config.warmup_steps + 1)
  model = task.build_model(num_classes)
  _check_tensor_parallel(model, mesh)
  optim.check_warmup(config.warmup_steps, total_steps)
  hyper = optim.hyperparameters(config, total_steps)
  tx, _ = optim.from_hyperparameters(config, hyper)  # for the state's shapes and init
  image_shape = (config.image_size, config.image_size, channels)

  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  init_fn, abstract = init_fn_and_shapes(model, tx, image_shape, init_rng, mesh)
  state_shardings = sharding.param_shardings(abstract, mesh)

  def train_fn_for(model):
    train_step = step_lib.make_train_step(
        apply_fn=model.apply, optimizer=functools.partial(optim.from_hyperparameters, config),
        loss_fn=task.loss_fn, num_classes=num_classes,
        label_smoothing=config.label_smoothing, accum_steps=config.accum_steps,
        reduce_axis=steps_lib.reduce_axis(config.parallelism),
        skip_nonfinite=config.max_nonfinite_steps > 0,
        objective=task.objective(model, num_classes))
    return steps_lib.compile_train_step(train_step, config.parallelism, mesh, state_shardings)

  train_fn = train_fn_for(model)
  eval_fn = steps_lib.compile_eval_step(task.eval_step(model, num_classes), mesh,
                                        state_shardings.params)
  return Program(config=config, mesh=mesh, model=model, task=task, pp=checked.pp, tx=tx,
                 num_classes=num_classes, num_train=num_train, data=data, total_steps=total_steps,
                 image_shape=image_shape, hyper=hyper, init_fn=init_fn, init_rng=init_rng,
                 dropout_rng=dropout_rng,
                 abstract_state=abstract, state_shardings=state_shardings, train_fn=train_fn,
                 eval_fn=eval_fn, target=placement.target, train_fn_for=train_fn_for)


__all__ = ['Init', 'Placement', 'Program', 'build_program', 'check_fp8', 'check_placement',
           'resolve_steps', 'dataset_facts', 'head_width', 'init_fn_and_shapes']
