"""One command line: `python -m vit_jax <command>`. Every command module imports into one process
(shared flags are defined once), the command list, and the one-line errors of the dispatcher. The
subprocesses fail or exit before jax or TensorFlow is imported, so this stays fast."""

import importlib
import os
import subprocess
import sys

import pytest

from vit_jax import cli
from vit_jax.commands import COMMANDS
from helpers import ROOT

NAMES = ['train', 'predict', 'export', 'convert', 'analyze', 'fewshot', 'evaluate', 'sweep', 'bench',
         'launch', 'weights']


def _run(*args):
  return subprocess.run([sys.executable, '-m', 'vit_jax', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)


def test_every_command_module_imports_into_one_process():
  modules = [importlib.import_module(f'vit_jax.commands.{name}') for name in NAMES]
  assert all(callable(m.main) for m in modules)
  assert list(COMMANDS) == NAMES


def test_help_lists_every_command_with_one_line():
  for args in [('--help',), ()]:
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in NAMES:
      (line,) = [l for l in lines if l.split()[:1] == [name]]
      assert len(line.split()) > 2, line  # the name and a description


def test_unknown_command_is_one_error_line():
  proc = _run('no_such_command', '--workdir=x')
  assert proc.returncode == 2
  (line,) = proc.stderr.splitlines()
  assert line.startswith('error: ') and 'no_such_command' in line
  assert all(name in line for name in NAMES)


@pytest.mark.parametrize('argv', [('train', '--help'), ('launch', '--helpfull'), ('predict', '-?'),
                                  ('export', '-h')])
def test_a_commands_usage_exits_0(argv):
  """absl prints the usage and exits with status 1; asked for, the usage is not a failure."""
  proc = _run(*argv)
  assert proc.returncode == 0, proc.stderr
  doc = importlib.import_module(f'vit_jax.commands.{argv[0]}').__doc__
  assert proc.stdout.startswith(doc.splitlines()[0])


def test_python_m_vit_jax_main_help_exits_0():
  proc = subprocess.run([sys.executable, '-m', 'vit_jax.main', '--help'], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and '--config' in proc.stdout, proc.stderr


@pytest.mark.parametrize('argv,expected', [
    (['p', '--help'], True), (['p', '--config=c.py', '-helpshort'], True), (['p', '-?'], True),
    (['p', '-h'], True),
    (['p'], False), (['p', '--help=false'], False), (['p', '--workdir=--help'], False),
    (['p', '--tpu=t', '--', 'python3', '-m', 'vit_jax.main', '--help'], False)])
def test_asks_for_help_reads_the_flags_before_a_double_dash(argv, expected):
  assert cli.asks_for_help(argv) is expected


def test_train_without_config_is_one_error_line(tmp_path):
  proc = _run('train', f'--workdir={tmp_path}/run')
  assert proc.returncode == 2
  (line,) = proc.stderr.splitlines()
  assert line.startswith('error: ') and '--config' in line
  assert not os.path.exists(tmp_path / 'run')
