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


__all__ = ['attributes']
