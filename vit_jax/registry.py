"""Functions registered by name, and the calls a config writes of them.

The preprocessing ops (vit_jax/data/ops.py) and the evaluators (vit_jax/evaluate/registry.py)
are each one `Registry`: a function joins it with `@REGISTRY.register('name')`, and a config names
it in a call written as Python: `name`, `name(2)`, `name(pad=2)`; a list joins calls with `|`
(`'pad_crop(pad=2)|flip'`). Arguments are literals (numbers, strings, booleans, None, tuples).

`Registry.parse(text, key)` reads such a text and checks every call against its function's
signature (and the function's own `check`, if it registered one) without calling it, so the one
config validation (vit_jax/train/validate.py) finds a wrong name or argument before anything is
built; an unknown name lists the registered ones. Errors name the config key.

A function registered outside vit_jax (by the config file that names it) is recorded with the
file that registered it (`sources`), so a reader of the run's checkpoint (`predict`, `fewshot`,
`export`) registers it again from there (`load_sources`).
"""

import ast
import dataclasses
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from vit_jax.errors import UserError


def _origin(fn: Callable) -> Tuple[str, str]:
  """(source file, qualified name) of a function."""
  return os.path.abspath(inspect.getsourcefile(fn) or ''), fn.__qualname__


@dataclasses.dataclass(frozen=True)
class Call:
  """One call of a registered function: its name and literal arguments."""
  name: str
  args: Tuple[Any, ...] = ()
  kwargs: Tuple[Tuple[str, Any], ...] = ()  # (name, value) in the order written

  def __str__(self) -> str:
    parts = [repr(a) for a in self.args] + [f'{k}={v!r}' for k, v in self.kwargs]
    return f'{self.name}({", ".join(parts)})' if parts else self.name

  @property
  def keywords(self) -> Dict[str, Any]:
    return dict(self.kwargs)


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered function and what it registered with."""
  name: str
  fn: Callable
  attrs: Dict[str, Any]
  check: Optional[Callable] = None  # check(context, **arguments): UserError for a bad value


class Registry:
  """Functions of one kind by name. `leading`: the parameters every function of the kind takes
  first (supplied by the caller, not written in a config), e.g. ('image', 'ctx'); `docs`: the
  page that shows how to register one."""

  def __init__(self, kind: str, leading: Tuple[str, ...], docs: str):
    self.kind, self.leading, self.docs = kind, tuple(leading), docs
    self._entries: Dict[str, Entry] = {}

  def register(self, name: str, *, check: Optional[Callable] = None, **attrs):
    """Decorator: registers the function as `name` (a name registered twice is a bug, unless
    the same file registers it again: `load_sources` running a config file loaded before)."""

    def add(fn: Callable) -> Callable:
      if name in self._entries and _origin(self._entries[name].fn) != _origin(fn):
        raise ValueError(f'{self.kind} {name!r} is registered twice')
      params = list(inspect.signature(fn).parameters)
      if params[:len(self.leading)] != list(self.leading):
        raise TypeError(f'{self.kind} {name!r} must take ({", ".join(self.leading)}, ...) first, '
                        f'not ({", ".join(params)})')
      self._entries[name] = Entry(name, fn, dict(attrs), check)
      return fn

    return add

  def unregister(self, name: str) -> None:
    """Removes `name` (for a test that registers a function of its own)."""
    del self._entries[name]

  def names(self) -> Tuple[str, ...]:
    return tuple(sorted(self._entries))

  def sources(self, names) -> Dict[str, str]:
    """{name: the file that registered it} of those of `names` registered outside vit_jax (a
    config file's own functions): what a checkpoint records so its readers find them again."""
    out = {}
    for name in sorted(set(names)):
      fn = self.get(name).fn
      if not (fn.__module__ or '').startswith('vit_jax.'):
        out[name] = _origin(fn)[0]
    return out

  def load_sources(self, sources: Dict[str, str], where: str) -> None:
    """Loads the files that registered `sources` ({name: file}, as `sources` recorded them) for
    the names not registered in this process; UserError naming `where` if a file is gone or no
    longer registers its name."""
    for name, path in sorted(sources.items()):
      if name in self._entries:
        continue
      if not os.path.isfile(path):
        raise UserError(f'{where} uses the {self.kind} {name!r} registered by {path}, which is '
                        f'gone: put that file back')
      spec = importlib.util.spec_from_file_location(f'_vit_jax_registered_{len(sys.modules)}',
                                                    path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      if name not in self._entries:
        raise UserError(f'{where} uses the {self.kind} {name!r}, which {path} no longer '
                        f'registers: register it there again')

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def get(self, name: str, key: str = '') -> Entry:
    if name not in self._entries:
      where = f' in config.{key}' if key else ''
      raise UserError(f'unknown {self.kind} {name!r}{where}: use one of '
                      f'{", ".join(self.names())} (or register one: {self.docs})')
    return self._entries[name]

  def parse(self, text: str, key: str) -> Tuple[Call, ...]:
    """The calls of `text` ('a|b(1)|c(k=2)'); UserError naming `key` for text that is not such
    calls. Names and arguments are not checked here (`check`)."""
    if not isinstance(text, str):
      raise UserError(f'config.{key}={text!r} must be a string of calls such as '
                      f"'name|name(1, k=2)'")
    try:
      tree = ast.parse(text.strip(), mode='eval').body
    except SyntaxError:
      raise UserError(f'config.{key}={text!r} is not a list of calls: write '
                      f"'name|name(1, k=2)' with literal arguments") from None
    return tuple(_call(node, text, key) for node in _terms(tree))

  def check(self, call: Call, key: str, context: Any = None) -> Entry:
    """The entry of `call`, its arguments bound to the function's signature and checked by the
    entry's `check(context, **arguments)`; UserError naming `key` otherwise."""
    entry = self.get(call.name, key)
    signature = inspect.signature(entry.fn)
    try:
      bound = signature.bind(*([None] * len(self.leading)), *call.args, **call.keywords)
    except TypeError as e:
      raise UserError(f'config.{key}: {call} does not fit {self.kind} {call.name}'
                      f'({self.arguments(call.name)}): {e}') from None
    if entry.check is not None:
      bound.apply_defaults()
      arguments = dict(list(bound.arguments.items())[len(self.leading):])
      try:
        entry.check(context, **arguments)
      except UserError as e:
        raise UserError(f'config.{key}: {call}: {e}') from None
    return entry

  def arguments(self, name: str) -> str:
    """The function's parameters after the leading ones, as a config writes them."""
    params = list(inspect.signature(self._entries[name].fn).parameters.values())
    return ', '.join(str(p) for p in params[len(self.leading):])

  def summary(self, name: str) -> str:
    """The first paragraph of the function's docstring, on one line."""
    doc = inspect.getdoc(self._entries[name].fn) or ''
    return ' '.join(doc.split('\n\n')[0].split())

  def table(self, columns: Tuple[Tuple[str, Callable[[Entry], str]], ...] = ()) -> str:
    """A markdown table of every entry: name, arguments, the extra `columns` ((title, fn of the
    entry)), what it does. docs/data.md holds the tables of both registries (a test checks)."""
    titles = ['name', 'arguments', *(t for t, _ in columns), 'what it does']
    lines = ['| ' + ' | '.join(titles) + ' |', '|' + '---|' * len(titles)]
    for name in self.names():
      entry = self._entries[name]
      cells = [f'`{name}`', f'`{self.arguments(name)}`' if self.arguments(name) else '',
               *(fn(entry) for _, fn in columns), self.summary(name)]
      lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _terms(node):
  """The operands of a chain of `|`, left to right."""
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
    return [*_terms(node.left), *_terms(node.right)]
  return [node]


def _call(node, text: str, key: str) -> Call:
  if isinstance(node, ast.Name):
    return Call(node.id)
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and all(
      k.arg is not None for k in node.keywords):
    try:
      args = tuple(ast.literal_eval(a) for a in node.args)
      kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except ValueError:
      raise UserError(f'config.{key}={text!r}: the arguments of {node.func.id} must be literals '
                      f'(numbers, strings, True/False/None, tuples)') from None
    return Call(node.func.id, args, kwargs)
  raise UserError(f'config.{key}={text!r}: {ast.unparse(node)!r} is not a call: write '
                  f"'name' or 'name(1, k=2)'")


def option_value(text: str) -> Any:
  """An option's value as written on a command line: a Python literal where it is one
  ('5', '(1, 5)', 'True'), else the text itself ('dtd+svhn')."""
  try:
    return ast.literal_eval(text.strip())
  except (ValueError, SyntaxError):
    return text.strip()


__all__ = ['Call', 'Entry', 'Registry', 'option_value']
