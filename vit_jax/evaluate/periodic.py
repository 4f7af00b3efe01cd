"""The evaluators a training run calls besides its eval split: built once from the config.

  fewshot   every `fewshot.every` steps (0 = never) and at the end: few-shot linear accuracies on
            `fewshot.dataset` (default: the run's dataset), logged as split 'fewshot'
  real      at every evaluation when `real.dataset` is set: ImageNet ReaL top-1, split 'real'
"""

from typing import Callable, Iterator, List, Tuple

from vit_jax.errors import UserError

Periodic = Tuple[str, int, Callable]


def periodic_evaluators(config, *, model, mesh, param_shardings, eval_pp) -> List[Periodic]:
  """[(name, every, evaluator)]: the evaluators `config` asks for. Their modules (tf.data
  pipelines, TensorFlow) are imported only for a config that asks for one."""
  out = []
  if config.fewshot.every:
    from vit_jax.evaluate.fewshot import FewShotEvaluator  # pylint: disable=g-import-not-at-top
    out.append(('fewshot', config.fewshot.every, FewShotEvaluator(
        model=model, mesh=mesh, param_shardings=param_shardings,
        dataset=config.fewshot.dataset or config.dataset, data_dir=config.data_dir,
        train_split=config.fewshot.train_split, eval_split=config.fewshot.eval_split,
        shots=config.fewshot.shots, l2_reg=config.fewshot.l2_reg,
        batch_size=config.eval_batch_size, pp=eval_pp, cache=config.cache)))
  if config.real.dataset:
    from vit_jax.evaluate.real import RealEvaluator  # pylint: disable=g-import-not-at-top
    try:
      out.append(('real', config.eval_every, RealEvaluator(
          model=model, mesh=mesh, param_shardings=param_shardings, dataset=config.real.dataset,
          data_dir=config.data_dir, split=config.real.split, batch_size=config.eval_batch_size,
          pp=eval_pp, cache=config.cache)))
    except UserError as e:
      raise UserError(f"{e} (ImageNet ReaL evaluation; config.real.dataset='' turns it "
                      f'off)') from None
  return out


def run_due(evaluators: List[Periodic], step: int, is_last: bool,
            get_params: Callable) -> Iterator[Tuple[str, dict]]:
  """(name, metrics) of every evaluator due at `step` (each is due at the last step too);
  `get_params()` gives the params to evaluate, only called when one is due."""
  for name, every, evaluator in evaluators:
    if step % every == 0 or is_last:
      yield name, evaluator(get_params())


__all__ = ['periodic_evaluators', 'run_due']
