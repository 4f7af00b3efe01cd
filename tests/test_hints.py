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
      # `--config.KEY`, and `config.KEY` as the library says it (the trainer adds the `--`);
      # a key with a formatted part (`config.evals.{name}.every`) is left out.
      for key in re.findall(r'(?<![\w.])config\.([a-z_][a-z0-9_.]*[a-z0-9_])(?![\w{])', message):
        if '..' in key:
          continue
        seen += 1
        if key not in keys:
          unknown.append((path, f'config.{key}'))
      for flag in re.findall(r'(?<![\w-])--([a-z][a-z0-9_]*)(?![\w.*-])', message):
        seen += 1
        if flag not in flags:
          unknown.append((path, f'--{flag}'))  # (`--suite_*`, a family, is left out)
  assert seen > 50  # the walk reads the errors' texts
  assert not unknown, unknown


# A command of ours named in a message (`-m vit_jax.main`, `-m vit_jax predict`, `vit-jax predict`),
# and another program's command line quoted in one (`tfds build x --data_dir=D`: its own flags).
_NAMED_COMMAND = re.compile(r'-m vit_jax(?:\.main\b|\s+([a-z]+))|\bvit-jax\s+([a-z]+)')
_OTHER_COMMAND = re.compile(r'`(?!python|\.venv|vit-jax)[^`]*`')


def command_flags(command: str) -> set:
  """The flags `python -m vit_jax <command>` accepts (`train` for vit_jax.main): its own and the
  shared ones it asks for (every command module imports into one process)."""
  import importlib  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from vit_jax.commands import COMMANDS  # pylint: disable=g-import-not-at-top
  modules = {name: importlib.import_module(f'vit_jax.commands.{name}') for name in COMMANDS}
  names = {f.name for f in flags.FLAGS.get_key_flags_for_module(modules[command])}
  return names | {f'no{n}' for n in names} | _OTHER_PROGRAMS


def unknown_flags(command: str, line: str) -> list:
  """The `--flags` an error line of `command` names that the command it names them for lacks: a
  flag after `python -m vit_jax.main` or `python -m vit_jax <other>` in the line is that one's."""
  unknown, owner, start = [], command, 0
  line = _OTHER_COMMAND.sub('', line)
  spans = [(m.start(), 'train' if m.group(0).endswith('main') else (m.group(1) or m.group(2)))
           for m in _NAMED_COMMAND.finditer(line)] + [(len(line), None)]
  for end, next_owner in spans:
    for flag in re.findall(r'(?<![\w-])--([a-z][a-z0-9_]*)(?![\w.*-])', line[start:end]):
      if flag not in command_flags(owner):
        unknown.append(f'--{flag} (not a flag of {owner})')
    owner, start = next_owner, end
  return unknown


def test_a_flag_is_checked_against_the_command_that_takes_it():
  assert unknown_flags('evaluate', 'error: x: pass --weights') == []
  assert unknown_flags('train', 'error: x: pass --weights') == ['--weights (not a flag of train)']
  line = 'error: no command: e.g. -- python -m vit_jax.main --config=... --workdir=/runs/x'
  assert unknown_flags('launch', line) == []
  assert unknown_flags('launch', 'error: use --workdir') == ['--workdir (not a flag of launch)']
  line = 'error: prepare it once with `tfds build cifar10 --data_dir=/d`, or point --data_dir at it'
  assert unknown_flags('evaluate', line) == []
  assert unknown_flags('train', line) == ['--data_dir (not a flag of train)']


def test_a_message_spells_a_setting_as_the_running_command_takes_it(monkeypatch):
  """`--config.data_dir` for the trainer, `--data_dir` for a command with that flag."""
  from vit_jax import errors  # pylint: disable=g-import-not-at-top
  from vit_jax.data.sources import tfds as tfds_source  # pylint: disable=g-import-not-at-top
  message = lambda: tfds_source._not_prepared_message('cifar10', object(), '/d/cifar10', '/d', None)  # pylint: disable=protected-access
  monkeypatch.setattr(errors, 'COMMAND_FLAGS', set())
  assert 'because --config.data_dir was not given' in message()
  assert unknown_flags('train', message()) == []
  monkeypatch.setattr(errors, 'COMMAND_FLAGS', command_flags('evaluate'))
  assert 'because --data_dir was not given' in message() and '--config.' not in message()
  assert unknown_flags('evaluate', message()) == []


def test_an_evaluator_option_is_spelled_as_the_running_command_sets_it(monkeypatch):
  from vit_jax import errors  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(errors, 'COMMAND_FLAGS', set())  # the trainer: its config keys
  assert errors.evals_option('fewshot', 'shots') == '--config.evals.fewshot.shots'
  assert 'evals.fewshot.shots' in _config_keys(common.base_config())
  monkeypatch.setattr(errors, 'COMMAND_FLAGS', set(command_flags('evaluate')))
  assert errors.evals_option('real', 'dataset') == '--option=real.dataset'
