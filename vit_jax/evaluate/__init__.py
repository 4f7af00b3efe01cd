"""Evaluators beyond the eval split's top-1, registered by name (registry.py): few-shot linear
evaluation and ImageNet ReaL, and any evaluator a config registers.

  FewShotEvaluator(...)(params) -> {'1shot': acc, '5shot': acc, ...}    (fewshot.py)
  RealEvaluator(...)(params)    -> {'accuracy': acc, 'count': n}        (real.py)
  periodic_evaluators(config, ...) -> [(name, every, evaluator)]        what the trainer runs
  register('name')                                                      adds an evaluator

The names load their module on first use (fewshot.py and real.py import TensorFlow): the trainer
imports this package at start-up but builds its evaluators only once its programs are compiling.
"""

from vit_jax import lazy

# name -> the module that defines it
_HOMES = {'FewShotEvaluator': 'fewshot', 'RealEvaluator': 'real',
          'periodic_evaluators': 'registry', 'register': 'registry', 'run_due': 'registry'}


__getattr__ = lazy.attributes(__name__, _HOMES)


__all__ = sorted(_HOMES)
