"""Packages whose names load their module on first use (so importing the package stays cheap)."""

import importlib


def attributes(package: str, homes: dict):
  """A module-level `__getattr__` for `package`: a name in `homes` ({name: submodule}) loads that
  submodule and returns its attribute; any other name loads the submodule of that name."""

  def getattr_(name):
    if name not in homes:  # a submodule not imported yet (`package.info`, ...)
      try:
        return importlib.import_module(f'{package}.{name}')
      except ModuleNotFoundError as e:
        if e.name != f'{package}.{name}':
          raise
        raise AttributeError(f'module {package!r} has no attribute {name!r}') from None
    return getattr(importlib.import_module(f'{package}.{homes[name]}'), name)

  return getattr_


class Module:
  """A module imported on its first attribute (`tf = lazy.Module('tensorflow')`), for a module
  whose functions use a heavy optional dependency only when they run: importing the module that
  holds them (to read their names and signatures, as config validation does) stays cheap."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr: str):
    return getattr(importlib.import_module(self._name), attr)


__all__ = ['Module', 'attributes']
