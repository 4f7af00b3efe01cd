"""Every flag and config key that an error's hint names exists: the `--flag` and `--config.KEY`
spelled in the text of each UserError raised in vit_jax/ (read from the source) are a flag some
command defines and a key of the config schema."""

import ast
import glob
import os
import re

from vit_jax.configs import common
from helpers import ROOT

_ERRORS = ('UserError', 'Damaged', 'WriteError')
# Flags that are not our commands' own: absl's, gcloud's (--worker), sbatch's (--constraint,
# passed through --sbatch_option).
_OTHER_PROGRAMS = {'help', 'helpfull', 'verbosity', 'worker', 'constraint'}


def _sources():
  for path in sorted(glob.glob(os.path.join(ROOT, 'vit_jax', '**', '*.py'), recursive=True)):
    with open(path) as f:
      yield os.path.relpath(path, ROOT), f.read()


def _error_texts(tree):
  """The literal text of each error raised with a type of `_ERRORS` (f-string parts joined)."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and node.args:
      name = getattr(node.func, 'attr', None) or getattr(node.func, 'id', None)
      if name in _ERRORS:
        yield ''.join(part.value for part in ast.walk(node.args[0])
                      if isinstance(part, ast.Constant) and isinstance(part.value, str))


def _defined_flags():
  names = set()
  for _, text in _sources():
    names |= set(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", text))
    names |= set(re.findall(r"_shared\(\s*'(\w+)'", text))
  return names | {f'no{n}' for n in names} | _OTHER_PROGRAMS


def _config_keys(config, prefix=''):
  out = set()
  for key, value in config.items():
    out.add(prefix + key)
    if hasattr(value, 'items'):
      out |= _config_keys(value, f'{prefix}{key}.')
  return out


def test_every_flag_and_config_key_an_error_names_exists():
  flags, keys = _defined_flags(), _config_keys(common.base_config())
  assert {'workdir', 'checkpoint', 'dtype'} <= flags and 'model.dtype' in keys
  unknown, seen = [], 0
  for path, text in _sources():
    for message in _error_texts(ast.parse(text)):
      for key in re.findall(r'--config\.([a-z_][a-z0-9_.]*[a-z0-9_])', message):
        seen += 1
        if key not in keys:
          unknown.append((path, f'--config.{key}'))
      for flag in re.findall(r'(?<![\w-])--([a-z][a-z0-9_]*)(?![\w.*-])', message):
        seen += 1
        if flag not in flags:
          unknown.append((path, f'--{flag}'))  # (`--suite_*`, a family, is left out)
  assert seen > 50  # the walk reads the errors' texts
  assert not unknown, unknown
