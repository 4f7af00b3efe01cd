"""The package layout's rules: imports go down the layers, never up, and no module imports itself
through others (a cycle); function-level imports count for both. Every module of vit_jax/ belongs to
a layer."""

import ast
import os

from helpers import ROOT

# Lowest first; a unit imports only units of lower layers.
LAYERS = (
    ('errors', 'quiet', 'fileio'),
    ('interrupt', 'lazy', 'platform', 'registry'),
    ('parallel',),
    ('models',),
    ('tasks', 'data', 'formats', 'checkpoint', 'configs'),
    ('analysis', 'serving'),
    ('evaluate', 'run'),
    ('train',),
    ('tools',),
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


def _sources():
  """(path, parsed tree) of every module of vit_jax/."""
  for dirpath, _, files in os.walk(os.path.join(ROOT, 'vit_jax')):
    for name in sorted(files):
      if name.endswith('.py'):
        path = os.path.join(dirpath, name)
        with open(path) as f:
          yield path, ast.parse(f.read(), path)


def _edges():
  for path, tree in _sources():
    for target in _imported_units(tree):
      yield os.path.relpath(path, ROOT), _unit(path), target


def _module_name(path: str) -> str:
  """'vit_jax.data.info' for vit_jax/data/info.py, 'vit_jax.data' for its __init__.py."""
  parts = os.path.relpath(path, ROOT)[:-len('.py')].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported_modules(tree, modules) -> set:
  """The modules of `modules` that `tree` imports: `from vit_jax.a import b` names the module
  vit_jax.a.b where there is one, else vit_jax.a (b is an attribute of it)."""
  def nearest(name):
    while name and name not in modules:
      name = name.rpartition('.')[0]
    return name

  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module.split('.')[0] == 'vit_jax':
        out |= {f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules
                else nearest(node.module) for a in node.names}
    elif isinstance(node, ast.Import):
      out |= {nearest(a.name) for a in node.names if a.name.split('.')[0] == 'vit_jax'}
  out.discard('')
  return out


def module_graph(sources) -> dict:
  """{module: the modules it imports} of (path, tree) pairs, function-level imports included."""
  sources = list(sources)
  modules = {_module_name(path) for path, _ in sources}
  return {_module_name(path): _imported_modules(tree, modules) - {_module_name(path)}
          for path, tree in sources}


def cycles(graph: dict) -> list:
  """The groups of modules that import each other (directly or through others): the strongly
  connected components of more than one module, each sorted, in a sorted list."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):  # Tarjan's algorithm
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for succ in sorted(graph.get(node, ())):
      if succ not in index:
        visit(succ)
        low[node] = min(low[node], low[succ])
      elif succ in on_stack:
        low[node] = min(low[node], index[succ])
    if low[node] == index[node]:
      group = []
      while not group or group[-1] != node:
        group.append(stack.pop())
        on_stack.discard(group[-1])
      if len(group) > 1:
        found.append(sorted(group))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return sorted(found)


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


def test_no_import_cycles():
  assert cycles(module_graph(_sources())) == []


def test_the_check_sees_a_cycle():
  """a -> b -> c -> a is one cycle (a function-level import closes it); d only imports into it."""
  def source(name, text):
    return os.path.join(ROOT, 'vit_jax', *name.split('.')) + '.py', ast.parse(text)

  graph = module_graph([
      source('pkg.a', 'from vit_jax.pkg import b\n'),
      source('pkg.b', 'import vit_jax.pkg.c\n'),
      source('pkg.c', 'def f():\n  from vit_jax.pkg.a import name\n'),
      source('pkg.d', 'from vit_jax.pkg import a\n'),
      source('pkg.__init__', 'from vit_jax.pkg import d\n')])
  assert graph['vit_jax.pkg'] == {'vit_jax.pkg.d'}
  assert cycles(graph) == [['vit_jax.pkg.a', 'vit_jax.pkg.b', 'vit_jax.pkg.c']]
  del graph['vit_jax.pkg.c']
  assert cycles(graph) == []
