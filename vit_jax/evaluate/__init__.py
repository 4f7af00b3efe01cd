"""Evaluators beyond the eval split's top-1: few-shot linear evaluation and ImageNet ReaL.

  FewShotEvaluator(...)(params) -> {'1shot': acc, '5shot': acc, ...}    (fewshot.py)
  RealEvaluator(...)(params)    -> {'accuracy': acc, 'count': n}        (real.py)
  periodic_evaluators(config, ...) -> [(name, every, evaluator)]        what the trainer runs
"""

from vit_jax.evaluate.fewshot import FewShotEvaluator
from vit_jax.evaluate.periodic import periodic_evaluators, run_due
from vit_jax.evaluate.real import RealEvaluator

__all__ = ['FewShotEvaluator', 'RealEvaluator', 'periodic_evaluators', 'run_due']
