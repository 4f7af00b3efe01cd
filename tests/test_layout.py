"""The package layout's one rule: imports go down the layers, never up (function-level imports
included), and every module of vit_jax/ belongs to a layer."""

import ast
import os

from helpers import ROOT

# Lowest first; a unit imports only units of lower layers.
LAYERS = (
    ('errors',),
    ('quiet', 'interrupt', 'hostmem', 'compile_cache', 'fileio', 'lazy', 'cpus', 'platform'),
    ('parallel',),
    ('models',),
    ('tasks', 'data', 'formats', 'checkpoint', 'xla_flags'),
    ('analysis', 'serving'),
    ('evaluate',),
    ('train',),
    ('benchmarking', 'sweeps', 'launch'),
    ('cli',),
    ('commands',),
    ('main', '__main__'),
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _unit(path: str) -> str:
  """The package (or top-level module) of vit_jax a file belongs to."""
  rel = os.path.relpath(path, os.path.join(ROOT, 'vit_jax'))
  first = rel.split(os.sep)[0]
  return first[:-3] if first.endswith('.py') else first


def _imported_units(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == 'vit_jax':
        yield from (alias.name for alias in node.names)
      elif node.module.startswith('vit_jax.'):
        yield node.module.split('.')[1]
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('vit_jax.'):
          yield alias.name.split('.')[1]


def _edges():
  for dirpath, _, files in os.walk(os.path.join(ROOT, 'vit_jax')):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(dirpath, name)
        with open(path) as f:
          tree = ast.parse(f.read(), path)
        for target in _imported_units(tree):
          yield os.path.relpath(path, ROOT), _unit(path), target


def test_every_module_is_in_a_layer():
  units = {unit for _, unit, _ in _edges()} | {
      _unit(os.path.join(ROOT, 'vit_jax', n)) for n in os.listdir(os.path.join(ROOT, 'vit_jax'))
      if n.endswith('.py') or os.path.isdir(os.path.join(ROOT, 'vit_jax', n, ''))
      and os.path.exists(os.path.join(ROOT, 'vit_jax', n, '__init__.py'))}
  units.discard('__init__')
  assert sorted(units - set(RANK)) == []


def test_imports_only_go_down():
  upward = [f'{path}: {unit} imports {target}' for path, unit, target in _edges()
            if target != unit and RANK[target] >= RANK[unit]]
  assert upward == []


def test_the_check_sees_an_upward_import():
  tree = ast.parse('def f():\n  from vit_jax.train import loop\nfrom vit_jax import commands\n')
  assert sorted(_imported_units(tree)) == ['commands', 'train']
