"""Evaluators by name: what a run computes besides its eval split's top-1, one registered
function each.

`config.evaluators` names the evaluators a run builds, as calls (`'fewshot'`,
`'confidence(every=200)'`; vit_jax/registry.py). An evaluator is `fn(run, *args) -> Periodic or
None`: `run` (`Run`) holds the config, the model, the mesh, the dataset's info and the eval
preprocessing; it returns how often it runs and the function that scores the params
(`params -> {metric: value}`, logged under the evaluator's name), or None when its own config keys
turn it off. One registered with `key='...'` is turned on by that key: a config that sets the key
must list the evaluator (config validation says so, before anything is built).

  fewshot   every `fewshot.every` steps (0 = off) and at the end: few-shot linear accuracies on
            `fewshot.dataset` (default: the run's dataset)
  real      at every evaluation when `real.dataset` is set: ImageNet ReaL top-1

Adding an evaluator: one registered function here (or in the config file that names it), and its
test; docs/recipes.md shows one and lists them all (a test checks the table).
"""

import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import jax

from vit_jax import data as data_lib
from vit_jax import parallel
from vit_jax import registry
from vit_jax.errors import UserError

EVALUATORS = registry.Registry('evaluator', leading=('run',), docs='docs/recipes.md')


def register(name: str, *, key: Optional[str] = None, check: Optional[Callable] = None):
  """Decorator: registers `fn(run, *args) -> Periodic or None` as evaluator `name`; `key`: the
  config key that turns it on (module docstring)."""
  return EVALUATORS.register(name, check=check, key=key)


@dataclasses.dataclass(frozen=True)
class Periodic:
  """An evaluator as a run calls it: every `every` steps and at the last one."""
  every: int
  evaluate: Callable[[Any], Dict[str, float]]


@dataclasses.dataclass(frozen=True)
class Run:
  """What an evaluator is built from."""
  config: Any
  model: Any
  mesh: Any
  param_shardings: Any
  data: Any      # the run's `data.DatasetInfo` (None where a run has no dataset)
  eval_pp: Any  # the run's parsed eval preprocessing (`specs.Spec`)

  def eval_batches(self, split: Optional[str] = None):
    """Re-iterable padded eval batches ({'image', 'label', 'mask'}, this process's share) of a
    split of the run's dataset (default: its eval split), preprocessed as its eval split."""
    batches, _ = data_lib.eval_iterator(
        info=self.data, split=split or self.config.eval_split,
        batch_size=self.config.eval_batch_size // jax.process_count(), spec=self.eval_pp,
        process_index=jax.process_index(), process_count=jax.process_count(),
        cache=self.config.cache)
    return batches

  def shard(self, batch: dict) -> dict:
    """A host-local batch as a global array sharded over the mesh's data axes."""
    return parallel.shard_batch(batch, self.mesh)


def calls(config) -> Tuple[registry.Call, ...]:
  """The evaluator calls of `config.evaluators` (a tuple of names or calls, or one string)."""
  value = config.evaluators
  texts = [value] if isinstance(value, str) else list(value)
  out = []
  for text in texts:
    out += EVALUATORS.parse(text, 'evaluators') if text else []
  return tuple(out)


def check(config) -> None:
  """`config.evaluators` checked (names, arguments, no name twice) and every evaluator that a set
  key turns on listed; UserError naming the key."""
  listed = calls(config)
  names = [c.name for c in listed]
  for call in listed:
    EVALUATORS.check(call, 'evaluators', config)
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise UserError(f'config.evaluators names {", ".join(twice)} twice: their metrics would share '
                    f'one name in the log; list each evaluator once')
  for name in EVALUATORS.names():
    key = EVALUATORS.get(name).attrs.get('key')
    if key and _value(config, key) and name not in names:
      raise UserError(f'config.{key}={_value(config, key)!r} turns on the {name} evaluator, which '
                      f'config.evaluators={tuple(config.evaluators)!r} does not list: add '
                      f"'{name}' to it, or unset config.{key}")


def _value(config, key: str):
  for part in key.split('.'):
    config = config[part]
  return config


def periodic_evaluators(config, *, model, mesh, param_shardings, eval_pp,
                        data=None) -> List[Tuple[str, int, Callable]]:
  """[(name, every, evaluator)]: the evaluators `config.evaluators` names that are on."""
  run = Run(config, model, mesh, param_shardings, data, eval_pp)
  out = []
  for call in calls(config):
    built = EVALUATORS.get(call.name).fn(run, *call.args, **call.keywords)
    if built is not None:
      out.append((call.name, built.every, built.evaluate))
  return out


def run_due(evaluators: List[Tuple[str, int, Callable]], step: int, is_last: bool,
            get_params: Callable) -> Iterator[Tuple[str, dict]]:
  """(name, metrics) of every evaluator due at `step` (each is due at the last step too);
  `get_params()` gives the params to evaluate, only called when one is due."""
  for name, every, evaluator in evaluators:
    if step % every == 0 or is_last:
      yield name, evaluator(get_params())


def table() -> str:
  """The markdown table of every registered evaluator (docs/recipes.md holds it; a test checks)."""
  return EVALUATORS.table((('turned on by', lambda entry: f"`{entry.attrs['key']}`"
                            if entry.attrs.get('key') else ''),))


# ---------------------------------------------------------------------------------------------
# The evaluators. Their modules read tf.data pipelines (TensorFlow): imported when one is built.


@register('fewshot', key='fewshot.every')
def fewshot(run: Run) -> Optional[Periodic]:
  """Few-shot linear accuracies of the frozen pre-logit features (1/5/10/25 images per class:
  `fewshot.shots`) on `fewshot.dataset` (default: the run's), every `fewshot.every` steps (0 =
  off) and at the end; logged as split `fewshot`."""
  c = run.config
  if not c.fewshot.every:
    return None
  from vit_jax.evaluate.fewshot import FewShotEvaluator  # pylint: disable=g-import-not-at-top
  dataset = c.fewshot.dataset or c.dataset
  return Periodic(c.fewshot.every, FewShotEvaluator(
      model=run.model, mesh=run.mesh, param_shardings=run.param_shardings, dataset=dataset,
      data_dir=c.data_dir, train_split=c.fewshot.train_split, eval_split=c.fewshot.eval_split,
      shots=c.fewshot.shots, l2_reg=c.fewshot.l2_reg, batch_size=c.eval_batch_size,
      spec=run.eval_pp, cache=c.cache, info=run.data if dataset == c.dataset else None))


@register('real', key='real.dataset')
def real(run: Run) -> Optional[Periodic]:
  """ImageNet ReaL top-1 (the reassessed labels of the ImageNet validation images) on
  `real.dataset` (`imagenet2012_real`; unset = off) at every evaluation; logged as split
  `real`."""
  c = run.config
  if not c.real.dataset:
    return None
  from vit_jax.evaluate.real import RealEvaluator  # pylint: disable=g-import-not-at-top
  try:
    return Periodic(c.eval_every, RealEvaluator(
        model=run.model, mesh=run.mesh, param_shardings=run.param_shardings,
        dataset=c.real.dataset, data_dir=c.data_dir, split=c.real.split,
        batch_size=c.eval_batch_size, spec=run.eval_pp, cache=c.cache))
  except UserError as e:
    raise UserError(f"{e} (ImageNet ReaL evaluation; config.real.dataset='' turns it "
                    f'off)') from None


__all__ = ['EVALUATORS', 'Periodic', 'Run', 'calls', 'check', 'fewshot', 'periodic_evaluators',
           'real', 'register', 'run_due', 'table']
