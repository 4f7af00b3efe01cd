"""Evaluators as config entries: `config.evals` holds one entry per evaluator, by name,

  config.evals.eval    = {type: 'top1'}                        the eval split's top-1 and loss
  config.evals.fewshot = {type: 'fewshot', every: 0, shots: (1, 5, 10, 25), ...}
  config.evals.knn     = {type: 'knn', every: 0, k: 20, temperature: 0.07, ...}

`type` names a registered evaluator type; `every` is the steps between its runs (and it runs at
the last step), unset = `config.eval_every`, 0 = not during training (the `evaluate` command
still runs it); `patch_sizes` (any type) scores a FlexiViT at those patch sizes too, each size's
metrics named `metric@pP` (unset: during training, the run's `flexi_patch_sizes`; () = the
model's own only); every other field is an option of the type, passed to its function by name.
The entry's name is the split its metrics are logged under (`metrics.jsonl`). A type is
`fn(run, **options) -> Evaluation`: `run` (`Run`) holds the config, the model, the mesh, the
dataset and the eval preprocessing. `check(config)` validates every entry before anything is
built: an unknown type lists the registered ones, an unknown option names its key.

Suites are named lists of entries or types (`register_suite('robustness', (...))`), which the
`evaluate` command expands (`--evals=robustness`).

Adding an evaluator: one registered function here (or in the config file that names it) and its
test; docs/evaluation.md lists them all (a test checks the table).
"""

import dataclasses
import functools
import inspect
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from vit_jax import data as data_lib
from vit_jax import errors
from vit_jax import lazy
from vit_jax import registry
from vit_jax.errors import UserError

jax = lazy.Module('jax')  # imported when an evaluator runs, not when a config is checked
parallel = lazy.Module('vit_jax.parallel')

EVALUATORS = registry.Registry('evaluator type', leading=('run',), docs='docs/evaluation.md')
SUITES: Dict[str, Tuple[str, ...]] = {}
FIELDS = ('type', 'every')  # the fields of every entry; the others are the type's options
GENERIC = ('patch_sizes',)  # options every type takes, applied by `build`, not by the type
RESERVED = ('train',)  # split names of the metrics log that an entry may not take


def register(name: str, *, check: Optional[Callable] = None,
             own_data: Optional[Callable] = None, trains: bool = False):
  """Decorator: registers `fn(run, **options) -> Evaluation` as evaluator type `name`; `check`:
  `check(run_config, **options)` raising UserError for a bad option value; `own_data`:
  `own_data(**options) -> dataset identity` for a type that reads datasets of its own, never
  the run's (the `evaluate` command then needs no --dataset with --weights); `trains`: the type
  trains runs of its own, so it runs only in the `evaluate` command (its entries: every=0)."""
  return EVALUATORS.register(name, check=check, own_data=own_data, trains=trains)


def own_data(call: registry.Call) -> Optional[dict]:
  """The identity of the data a call of an `own_data` type reads; None for the others."""
  describe = EVALUATORS.get(call.name).attrs.get('own_data')
  return describe(**call.keywords) if describe is not None else None


def register_suite(name: str, members: Sequence[str]) -> None:
  """A named list of evaluator entries or types, run together by `evaluate --evals=NAME`."""
  if name in SUITES or name in EVALUATORS:
    raise ValueError(f'suite {name!r} is registered twice (or is an evaluator type)')
  SUITES[name] = tuple(members)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A built evaluator: `evaluate(params) -> {metric: value}`; `describe(metrics)`: its progress
  line (default: every metric)."""
  evaluate: Callable[[Any], Dict[str, float]]
  describe: Optional[Callable[[Dict[str, float]], str]] = None


@dataclasses.dataclass(frozen=True)
class Scheduled:
  """An entry as a run calls it: every `every` steps (0: never) and at the last one."""
  name: str
  type: str
  every: int
  evaluation: Evaluation

  def line(self, step: int, metrics: Dict[str, float]) -> str:
    if self.evaluation.describe is not None:
      return f'step {step}: {self.evaluation.describe(metrics)}'
    shown = ' '.join(f'{k} {v:.4f}' for k, v in metrics.items())
    # An evaluator whose one metric carries its own name shows the name once.
    return f'step {step}: ' + (shown if list(metrics) == [self.name] else f'{self.name} {shown}')


@dataclasses.dataclass(frozen=True)
class Run:
  """What an evaluator is built from. `eval_fn`: the compiled eval step of the run's task (built
  on first use when absent); `cache`: where features are kept (`features.FeatureCache`, used on
  one process; None = recomputed each time, as during training); `task`: the run's resolved
  `tasks.Task` (resolved from the config when absent); for evaluators that fine-tune (None
  during training): `init`, what the `evaluate` command scores (a checkpoint step directory, or
  released weights by name or file), `directory`, its table directory, and `train`, the
  trainer's runner the command hands down (vit_jax/tools/sweeps/trials.py `run_trials`)."""
  config: Any
  model: Any
  mesh: Any
  param_shardings: Any
  data: Any      # the run's `data.DatasetInfo` (None where a run has no dataset)
  eval_pp: Any  # the run's parsed eval preprocessing (`specs.Spec`)
  eval_fn: Optional[Callable] = None
  cache: Any = None
  task: Any = None
  init: Optional[str] = None
  directory: Optional[str] = None
  train: Optional[Callable] = None
  entry: str = ''  # the name of the config.evals entry being built (`build` sets it)
  _memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def info(self, dataset: Optional[str] = None):
    """The `data.DatasetInfo` of `dataset` (None: the run's), looked up once."""
    if not dataset or (self.data is not None and dataset == self.config.dataset):
      return self.data
    if ('info', dataset) not in self._memo:
      self._memo[('info', dataset)] = data_lib.get_info(dataset, self.config.data_dir)
    return self._memo[('info', dataset)]

  def eval_batches(self, split: Optional[str] = None, dataset: Optional[str] = None):
    """Re-iterable padded eval batches ({'image', 'label', 'mask'}, this process's share) of a
    split of a dataset (default: the run's eval split of the run's dataset), preprocessed as the
    run's eval split."""
    batches, _ = data_lib.eval_iterator(
        info=self.info(dataset), split=split or self.config.eval_split,
        batch_size=self.config.eval_batch_size // jax.process_count(), spec=self.eval_pp,
        process_index=jax.process_index(), process_count=jax.process_count(),
        cache=self.config.cache)
    return batches

  def resolved_task(self):
    """The run's `tasks.Task`: the one passed in, else resolved from the config once."""
    if self.task is not None:
      return self.task
    if 'task' not in self._memo:
      from vit_jax import tasks  # pylint: disable=g-import-not-at-top
      self._memo['task'] = tasks.get_task(self.config)
    return self._memo['task']

  def shard(self, batch: dict) -> dict:
    """A host-local batch as a global array sharded over the mesh's data axes."""
    return parallel.shard_batch(batch, self.mesh)

  def features(self, params, split: str, dataset: Optional[str] = None):
    """(pre-logit features [N, D], labels [N]) of a split (features.py), through the run's
    cache when it has one."""
    from vit_jax.evaluate import features  # pylint: disable=g-import-not-at-top
    if 'extractor' not in self._memo:
      self._memo['extractor'] = features.Extractor(self.model, self.mesh, self.param_shardings)
    info = self.info(dataset)
    # One process only: processes that saw different chunks on disk would gather out of step.
    cache = (self.cache.for_data(features.dataset_identity(info), split, str(self.eval_pp.ops),
                                 self.config.eval_batch_size)
             if self.cache is not None and jax.process_count() == 1 else None)
    return self._memo['extractor'](params, self.eval_batches(split, dataset), cache)

  def at_patch_size(self, patch_size: int, key: str) -> 'Run':
    """This context with its FlexiViT model run at `patch_size` (`flexi.at_patch_size`, a
    one-line UserError naming `key` where it cannot), its own eval step and feature cache."""
    from vit_jax.evaluate import features  # pylint: disable=g-import-not-at-top
    from vit_jax.models import flexi  # pylint: disable=g-import-not-at-top
    model = flexi.at_patch_size(self.model, patch_size, self.config.image_size, key)
    cache = None if self.cache is None else features.FeatureCache(
        self.cache.directory, {**self.cache.identity, 'patch_size': patch_size},
        self.cache.chunk_batches)
    return dataclasses.replace(self, model=model, eval_fn=None, cache=cache, _memo={})

  def scoring_step(self) -> Callable:
    """The run's compiled eval step: (params, batch) -> sums of 'correct', 'loss', 'count'."""
    if self.eval_fn is not None:
      return self.eval_fn
    if 'eval_fn' not in self._memo:
      from vit_jax.parallel import steps  # pylint: disable=g-import-not-at-top
      task = self.resolved_task()
      self._memo['eval_fn'] = steps.compile_eval_step(
          task.eval_step(self.model, self.model.num_classes), self.mesh, self.param_shardings)
    return self._memo['eval_fn']


# ---------------------------------------------------------------------------------------------
# Entries of a config.


def _entries(config) -> Dict[str, Any]:
  evals = config.get('evals') if hasattr(config, 'get') else None
  return dict(evals.items()) if evals is not None else {}


def _call(name: str, entry) -> Tuple[registry.Call, Any]:
  """(the call of the entry's type with its options, its `every`); UserError naming the key."""
  if not hasattr(entry, 'items') or 'type' not in entry:
    raise UserError(f'config.evals.{name} must be an entry with a type, e.g. '
                    f"config.evals.{name} = dict(type='knn'): use one of "
                    f'{", ".join(EVALUATORS.names())}')
  kind = entry['type']
  EVALUATORS.get(kind, f'evals.{name}.type')
  params = list(inspect.signature(EVALUATORS.get(kind).fn).parameters)[1:]
  options = tuple((k, v) for k, v in entry.items() if k not in FIELDS)
  for key, _ in options:
    if key not in params and key not in GENERIC:
      raise UserError(f'config.evals.{name}.{key} is not an option of evaluator type {kind}: use '
                      f'{", ".join(params) or "no options"} (or every)')
  return registry.Call(kind, (), options), entry.get('every')


def check(config) -> None:
  """Every entry of `config.evals` checked (its type registered, its options the type's, their
  values by the type's check, `every` a count of steps); UserError naming the key."""
  for name, entry in _entries(config).items():
    if name in RESERVED:
      raise UserError(f'config.evals.{name}: {name!r} is the train metrics\' split in the log: '
                      f'name the evaluator otherwise')
    call, every = _call(name, entry)
    if every is not None and (not isinstance(every, int) or every < 0):
      raise UserError(f'config.evals.{name}.every={every!r} must be a number of steps >= 0 '
                      f'(0: not during training; unset: config.eval_every)')
    if every != 0 and EVALUATORS.get(call.name).attrs.get('trains'):
      raise UserError(f'config.evals.{name}.every={every!r}: type {call.name} trains runs of its '
                      f'own, after training: give it every=0 and run python -m vit_jax evaluate '
                      f'--evals={name}')
    _check_values(name, call, config)


def _check_values(name: str, call: registry.Call, config, where: str = 'config.evals.') -> None:
  """The option values of an entry, by its type's check (its message starts with the option,
  after `where` and the entry's name)."""
  entry = EVALUATORS.get(call.name)
  if entry.check is None:
    return
  bound = inspect.signature(entry.fn).bind(None, **_own_options(call)[0])
  bound.apply_defaults()
  try:
    entry.check(config, **dict(list(bound.arguments.items())[1:]))
  except UserError as e:
    raise UserError(f'{where}{name}.{e}') from None


def _unknown(name: str, entries: Iterable[str]) -> UserError:
  choices = sorted(set(entries) | set(EVALUATORS.names()) | set(SUITES))
  return UserError(f'unknown evaluator {name!r}: use one of {", ".join(choices)} (an entry of '
                   f'the run\'s config.evals, a registered type or a suite; docs/evaluation.md)')


def refuse_unknown(names: Iterable[str], entries: Iterable[str]) -> None:
  """`resolve`'s line for a name that is no entry of `entries` (the names of the run's
  config.evals, read from its stored config before the run is loaded), no type and no suite."""
  entries = set(entries)
  for name in names:
    if name not in entries and name not in EVALUATORS and name not in SUITES:
      raise _unknown(name, entries)


def resolve(config, names: Iterable[str], options: Optional[Dict[str, Dict[str, Any]]] = None,
            known_only: bool = False) -> Dict[str, Tuple[registry.Call, Any]]:
  """{entry name: (call, every)} of `names`: an entry of `config.evals`, a registered type (its
  defaults, named after it) or a suite (its members); UserError listing the choices.
  `options`: {entry name: {option: value}} replacing the entries' own (the command's --option);
  `known_only`: names that are no type or suite are left out, not refused (the command checks
  the types' options before it reads the run's config)."""
  entries, out, unknown = _entries(config), {}, []
  for name in names:
    if name in entries:
      out[name] = _call(name, entries[name])
    elif name in EVALUATORS:
      out[name] = (registry.Call(name), None)
    elif name in SUITES:
      out.update(resolve(config, SUITES[name], known_only=known_only))
    elif known_only:
      unknown.append(name)  # an entry of the run's config, perhaps: checked once it is read
    else:
      raise _unknown(name, entries)
  options = options or {}
  for name, given in options.items():
    if name in out:
      out[name] = (_with_options(name, out[name][0], given), out[name][1])
    elif name not in unknown:
      raise UserError(f'--option={name}.{next(iter(given))}=...: {name!r} is not among the '
                      f'evaluators --evals runs ({", ".join(list(out) + unknown)})')
  for name, (call, _) in out.items():
    _check_values(name, call, config, '--option=' if name in options else 'config.evals.')
  return out


def _with_options(name: str, call: registry.Call, given: Dict[str, Any]) -> registry.Call:
  """`call` with the options `given` replacing its own; UserError for one the type lacks."""
  params = list(inspect.signature(EVALUATORS.get(call.name).fn).parameters)[1:] + list(GENERIC)
  for key in given:
    if key not in params:
      raise UserError(f'--option={name}.{key}=...: {key!r} is not an option of evaluator type '
                      f'{call.name}: use {", ".join(params) or "none (it has no options)"}')
  return registry.Call(call.name, (), tuple({**call.keywords, **given}.items()))


def _own_options(call: registry.Call) -> Tuple[Dict[str, Any], Optional[Tuple[int, ...]]]:
  """(the options of the call's type, its `patch_sizes` or None where unset)."""
  options = dict(call.keywords)
  sizes = options.pop('patch_sizes', None)
  return options, None if sizes is None else tuple(sizes)


def build(run: Run, name: str, call: registry.Call, every=None,
          patch_sizes: Tuple[int, ...] = ()) -> Scheduled:
  """An entry built with the run's context; `patch_sizes`: the sizes a FlexiViT is scored at
  where the entry sets none."""
  every = run.config.eval_every if every is None else int(every)
  options, sizes = _own_options(call)
  fn = EVALUATORS.get(call.name).fn
  run = dataclasses.replace(run, entry=name)
  evaluation = fn(run, **options)
  sizes = patch_sizes if sizes is None else sizes
  if sizes:
    key = f'config.evals.{name}.patch_sizes'
    own = getattr(run.model, 'patch', (None,))[0]  # (a BiT has none: refused at every size)
    evaluation = _at_patch_sizes(name, evaluation, {
        p: evaluation if p == own else fn(run.at_patch_size(p, key), **options)
        for p in dict.fromkeys(sizes)})
  return Scheduled(name, call.name, every, evaluation)


def _at_patch_sizes(name: str, own: Evaluation, at: Dict[int, Evaluation]) -> Evaluation:
  """`own` (the model's own patch size: its metrics as they are) and the evaluations `at`
  other patch sizes (their metrics named `metric@pP`) as one; the own size is scored once."""

  def evaluate(params):
    metrics = own.evaluate(params)
    out = dict(metrics)
    for p, evaluation in at.items():
      values = metrics if evaluation is own else evaluation.evaluate(params)
      out.update({f'{k}@p{p}': v for k, v in values.items()})
    return out

  def shown(evaluation: Evaluation, metrics: Dict[str, float]) -> str:
    if evaluation.describe is not None:
      return evaluation.describe(metrics)
    return f'{name} ' + ' '.join(f'{k} {v:.4f}' for k, v in metrics.items())

  def describe(metrics):
    parts = [shown(own, {k: v for k, v in metrics.items() if '@p' not in k})]
    for p, evaluation in at.items():
      if evaluation is own:
        continue
      suffix = f'@p{p}'
      parts.append(f'patch {p}: ' + shown(evaluation, {
          k[:-len(suffix)]: v for k, v in metrics.items() if k.endswith(suffix)}))
    return '; '.join(parts)

  return Evaluation(evaluate, describe)


def periodic_evaluators(config, run: Run) -> List[Scheduled]:
  """The entries of `config.evals` that run during training (`every` > 0), built, by name; a
  FlexiViT run's are scored at its `flexi_patch_sizes` where an entry sets no `patch_sizes`."""
  out = []
  for name, entry in sorted(_entries(config).items()):
    call, every = _call(name, entry)
    if every is None or every > 0:
      out.append(build(run, name, call, every, tuple(config.flexi_patch_sizes)))
  return out


def run_due(evaluators: List[Scheduled], step: int, is_last: bool,
            get_params: Callable) -> Iterable[Tuple[Scheduled, dict]]:
  """(evaluator, metrics) of every evaluator due at `step` (each is due at the last step too);
  `get_params()` gives the params to evaluate, only called when one is due."""
  for scheduled in evaluators:
    if step % scheduled.every == 0 or is_last:
      yield scheduled, scheduled.evaluation.evaluate(get_params())


def table() -> str:
  """The markdown table of every registered evaluator type (docs/evaluation.md holds it; a test
  checks)."""
  return EVALUATORS.table()


# ---------------------------------------------------------------------------------------------
# The evaluator types. Those that read tf.data pipelines import their modules when built.


@register('top1')
def top1(run: Run, split: Optional[str] = None) -> Evaluation:
  """Top-1 (the task's metric) and loss of the model's own head on `split` (default: the run's
  `eval_split`); the run's return value and learning curve read the entry named `eval`."""
  c = run.config
  split = split or c.eval_split
  built = []  # (batches, step), made on the first call

  def batches_and_step():
    if not built:
      built.append((run.eval_batches(split), run.scoring_step()))
    return built[0]

  if run.data is not None:
    batches_and_step()  # a bad split fails as the run starts, not at its first evaluation
  metric = run.resolved_task().metric_name

  def evaluate(params):
    batches, step = batches_and_step()
    totals = None
    for batch in batches:
      out = step(params, run.shard(batch))
      totals = out if totals is None else jax.tree.map(lambda a, b: a + b, totals, out)
    totals = jax.device_get(totals)
    count = float(totals['count'])
    return {'accuracy': float(totals['correct']) / count, 'loss': float(totals['loss']) / count,
            'count': count}

  def describe(m):
    return (f'eval {split} {metric} {m["accuracy"]:.4f}, loss {m["loss"]:.4f} '
            f'({int(m["count"])} examples)')

  return Evaluation(evaluate, describe)


def _check_fewshot(config, dataset, train_split, eval_split, shots, l2_reg):
  del config, dataset, train_split, eval_split
  if not shots or min(int(n) for n in shots) < 1:
    raise UserError(f'shots={tuple(shots)} must be positive numbers of examples per class, '
                    f'e.g. (1, 5, 10, 25)')
  if l2_reg < 0:
    raise UserError(f'l2_reg={l2_reg} is negative: use a value >= 0, e.g. 1.0')


@register('fewshot', check=_check_fewshot)
def fewshot(run: Run, dataset: Optional[str] = None, train_split: str = 'train',
            eval_split: str = 'test', shots: Tuple[int, ...] = (1, 5, 10, 25),
            l2_reg: float = 1.0) -> Evaluation:
  """Few-shot linear accuracies of the frozen pre-logit features: a closed-form ridge map onto
  {-1, 1} targets fit on the first n `train_split` images per class (`shots`), scored on
  `eval_split` of `dataset` (default: the run's)."""
  from vit_jax.evaluate.fewshot import FewShotEvaluator  # pylint: disable=g-import-not-at-top
  c = run.config
  dataset = dataset or c.dataset
  return Evaluation(FewShotEvaluator(
      model=run.model, mesh=run.mesh, param_shardings=run.param_shardings, dataset=dataset,
      data_dir=c.data_dir, train_split=train_split, eval_split=eval_split, shots=shots,
      l2_reg=l2_reg, batch_size=c.eval_batch_size, spec=run.eval_pp, cache=c.cache,
      info=run.info(dataset), setting=functools.partial(errors.evals_option, run.entry)))


@register('real')
def real(run: Run, dataset: str = 'imagenet2012_real', split: str = 'validation') -> Evaluation:
  """ImageNet ReaL top-1 (the reassessed labels of the ImageNet validation images) on `dataset`
  (`imagenet2012_real`, or the ILSVRC2012 archives with `real.json`)."""
  from vit_jax.evaluate.real import RealEvaluator  # pylint: disable=g-import-not-at-top
  c = run.config
  return Evaluation(RealEvaluator(
      model=run.model, mesh=run.mesh, param_shardings=run.param_shardings, dataset=dataset,
      data_dir=c.data_dir, split=split, batch_size=c.eval_batch_size, spec=run.eval_pp,
      cache=c.cache, setting=functools.partial(errors.evals_option, run.entry)))


def _check_robustness(config, sets):
  del config
  from vit_jax.evaluate import robustness as robustness_lib  # pylint: disable=g-import-not-at-top
  try:
    robustness_lib.set_names(sets)
  except ValueError as e:
    raise UserError(f'sets={sets!r}: {e}') from None


@register('robustness', check=_check_robustness)
def robustness(run: Run, sets: str = 'all') -> Evaluation:
  """Top-1 of an ImageNet classifier on the robustness sets (`sets`: all, or names joined by +
  such as imagenet_r+imagenet_a), each over its own classes (vit_jax/evaluate/robustness.py),
  read from `data_dir`."""
  from vit_jax.evaluate import robustness as robustness_lib  # pylint: disable=g-import-not-at-top
  c = run.config
  return Evaluation(robustness_lib.RobustnessEvaluator(
      model=run.model, mesh=run.mesh, param_shardings=run.param_shardings,
      sets=robustness_lib.set_names(sets), data_dir=c.data_dir, batch_size=c.eval_batch_size,
      spec=run.eval_pp, cache=c.cache))


def _train_test(run: Run, params, dataset, train_split, test_split):
  """The features of both splits (read once per params; cached where the run caches)."""
  info = run.info(dataset)
  train = run.features(params, train_split, dataset)
  test = run.features(params, test_split, dataset)
  return info.num_classes, train, test


def _check_knn(config, dataset, train_split, eval_split, k, temperature, weighting):
  del config, dataset, train_split, eval_split
  from vit_jax.evaluate import options  # pylint: disable=g-import-not-at-top
  options.check_knn(k, temperature, weighting)


@register('knn', check=_check_knn)
def knn(run: Run, dataset: Optional[str] = None, train_split: str = 'train',
        eval_split: str = 'test', k: int = 20, temperature: float = 0.07,
        weighting: str = 'exp') -> Evaluation:
  """k-NN top-1 and top-5 of the frozen pre-logit features (cosine similarity; the k nearest
  `train_split` examples vote with weight exp(similarity / temperature), or 1 with
  `weighting='uniform'`, as DINO) on `eval_split` of `dataset` (default: the run's)."""
  from vit_jax.evaluate import knn as knn_lib  # pylint: disable=g-import-not-at-top

  def evaluate(params):
    num_classes, (tx, ty), (sx, sy) = _train_test(run, params, dataset, train_split, eval_split)
    return knn_lib.knn_accuracy(tx, ty, sx, sy, num_classes=num_classes, k=k,
                                temperature=temperature, weighting=weighting)

  return Evaluation(evaluate)


def _check_probe(config, dataset, train_split, eval_split, l2_grid, holdout, steps):
  del config, dataset, train_split, eval_split
  from vit_jax.evaluate import options  # pylint: disable=g-import-not-at-top
  options.check_probe(l2_grid, holdout, steps)


@register('linear_probe', check=_check_probe)
def linear_probe(run: Run, dataset: Optional[str] = None, train_split: str = 'train',
                 eval_split: str = 'test',
                 l2_grid: Tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
                 holdout: float = 0.2, steps: int = 500) -> Evaluation:
  """Linear-probe top-1: a multinomial logistic regression on the frozen pre-logit features of
  `train_split` (L-BFGS, `steps` iterations), its L2 strength the best of `l2_grid` on a
  held-out `holdout` fraction of it, refit on all of it; scored on `eval_split`."""
  from vit_jax.evaluate import linear_probe as probe_lib  # pylint: disable=g-import-not-at-top

  def evaluate(params):
    num_classes, (tx, ty), (sx, sy) = _train_test(run, params, dataset, train_split, eval_split)
    return probe_lib.probe_accuracy(tx, ty, sx, sy, num_classes=num_classes, l2_grid=l2_grid,
                                    holdout=holdout, steps=steps)

  return Evaluation(evaluate)


def _check_vtab(config, tasks, overrides, launcher):
  del config
  from vit_jax.evaluate import vtab as vtab_lib  # pylint: disable=g-import-not-at-top
  vtab_lib.check_options(tasks, overrides, launcher)


def _vtab_data(tasks: str = 'all', **unused) -> dict:
  del unused
  from vit_jax.evaluate import vtab as vtab_lib  # pylint: disable=g-import-not-at-top
  names = vtab_lib.task_names(tasks)
  return {'name': 'VTAB-1k', 'tasks': list(names)}


@register('vtab', check=_check_vtab, own_data=_vtab_data, trains=True)
def vtab(run: Run, tasks: str = 'all', overrides: str = '',
         launcher: str = 'process') -> Evaluation:
  """VTAB-1k: the checkpoint fine-tuned on each task (`tasks`: all, or names joined by + such
  as dtd+svhn) with the paper's recipe (vit_jax/configs/finetune.py; `overrides`: config values
  to change, key=value joined by commas), each trainer in its own process (`launcher`: process,
  or inline in this one); each task's top-1, the natural / specialized / structured means and
  the mean of the 19."""
  from vit_jax.evaluate import vtab as vtab_lib  # pylint: disable=g-import-not-at-top
  if run.init is None or run.directory is None or run.train is None:  # `check` refuses it first
    raise UserError('evaluator type vtab fine-tunes a checkpoint: run it with python -m vit_jax '
                    'evaluate --evals=vtab, not during training (give its entry every=0)')

  def evaluate(params):
    del params  # the fine-tunes start from the checkpoint's files (config.init = run.init)
    if jax.process_count() > 1:  # each trainer makes its own mesh of this machine's devices
      raise UserError('--evals=vtab runs on one process: start the evaluate command on one '
                      'machine (each fine-tune uses its devices)')
    say = lambda line: print(line, file=sys.stderr, flush=True)
    return vtab_lib.metrics(vtab_lib.fine_tune(run.config, run.init, run.directory, run.train,
                                               tasks, overrides, launcher, say=say))

  return Evaluation(evaluate)


__all__ = ['EVALUATORS', 'Evaluation', 'FIELDS', 'Run', 'SUITES', 'Scheduled', 'build', 'check',
           'fewshot', 'knn', 'linear_probe', 'own_data', 'periodic_evaluators', 'real',
           'register', 'register_suite', 'resolve', 'robustness', 'run_due', 'table', 'top1',
           'vtab']
