"""Evaluators, each a self-contained entry of `config.evals` (registry.py): the eval split's
top-1, few-shot linear evaluation, ImageNet ReaL, k-NN, the linear probe, and any evaluator a
config registers; features extracted once through features.py; checkpoints scored by the
`evaluate` command (checkpoint.py).

  FewShotEvaluator(...)(params) -> {'1shot': acc, '5shot': acc, ...}    (fewshot.py)
  RealEvaluator(...)(params)    -> {'accuracy': acc, 'count': n}        (real.py)
  periodic_evaluators(config, run) -> [Scheduled]                       what the trainer runs
  register('name'), register_suite('name', members)                     adds an evaluator, a suite

The names load their module on first use (fewshot.py and real.py import TensorFlow): the trainer
imports this package at start-up but builds its evaluators only once its programs are compiling.
"""

from vit_jax import lazy

# name -> the module that defines it
_HOMES = {'FewShotEvaluator': 'fewshot', 'RealEvaluator': 'real', 'Run': 'registry',
          'periodic_evaluators': 'registry', 'register': 'registry',
          'register_suite': 'registry', 'run_due': 'registry'}


__getattr__ = lazy.attributes(__name__, _HOMES)


__all__ = sorted(_HOMES)
