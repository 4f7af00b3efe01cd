"""Evaluators beyond the eval split's top-1: few-shot linear evaluation and ImageNet ReaL.

  FewShotEvaluator(...)(params) -> {'1shot': acc, '5shot': acc, ...}    (fewshot.py)
  RealEvaluator(...)(params)    -> {'accuracy': acc, 'count': n}        (real.py)
  periodic_evaluators(config, ...) -> [(name, every, evaluator)]        what the trainer runs

The names load their module on first use (real.py imports TensorFlow; fewshot.py only for a
dataset it reads through tf.data): the trainer imports this package at start-up but builds its
evaluators only once its programs are compiling.
"""

from vit_jax import lazy

# name -> the module that defines it
_HOMES = {'FewShotEvaluator': 'fewshot', 'RealEvaluator': 'real',
          'periodic_evaluators': 'periodic', 'run_due': 'periodic'}


__getattr__ = lazy.attributes(__name__, _HOMES)


__all__ = sorted(_HOMES)
