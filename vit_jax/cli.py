"""What every command-line entry point shares: flag parsing and one-line user errors.

A user mistake (bad flag, bad config value, unknown variant, ...) prints `error: <what and how to
fix>` on stderr and exits 2, without a traceback. Internal bugs keep their traceback.
"""

import ast
import difflib
import importlib.util
import os
import re
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # keep TensorFlow's C++ banner quiet

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
from absl import logging  # pylint: disable=g-import-not-at-top

from vit_jax import errors  # pylint: disable=g-import-not-at-top
from vit_jax.platform import compile_cache  # pylint: disable=g-import-not-at-top
from vit_jax.platform import hostmem  # pylint: disable=g-import-not-at-top
from vit_jax.platform import tf_import  # pylint: disable=g-import-not-at-top
from vit_jax import interrupt  # pylint: disable=g-import-not-at-top
from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
from vit_jax.configs.common import UNSET_SPELLINGS  # pylint: disable=g-import-not-at-top

EXIT_USER_ERROR = 2
# The flags that ask for a command's usage: absl's (it prints the usage, then exits with status 1,
# which run_main turns into 0) and -h, passed to absl as --help. The dispatcher
# (vit_jax/__main__.py) also takes the word help.
HELP_FLAGS = frozenset({'-h', '-?', *(dash + name for dash in ('-', '--')
                                      for name in ('help', 'helpshort', 'helpfull', 'helpxml'))})

# A config key as libraries name it (`config.lr`, `config.model.remat`), not already a flag.
_CONFIG_KEY = re.compile(r'(?<![\w.\-/])config\.(?=[a-z_])')


def as_flags(message: str) -> str:
  """A library's message as the command line says it: `config.lr=...` -> `--config.lr=...`."""
  return _CONFIG_KEY.sub('--config.', message)


def fail(message: str, *, quiet_after: bool = False) -> None:
  """Prints the one error line and exits 2. `quiet_after`: nothing printed after it (what the
  command's background threads would still say about the failure; `interrupt.silence`)."""
  print(f'error: {as_flags(message)}', file=sys.stderr, flush=True)
  if quiet_after:
    interrupt.silence()
  sys.exit(EXIT_USER_ERROR)


def _flag_part(args: list) -> list:
  """The arguments before a `--` (after it they are another command's: `launch ... -- cmd`)."""
  return args[:args.index('--')] if '--' in args else args


def _parse_flags(argv):
  head = len(_flag_part(argv))
  argv = [('--help' if arg == '-h' else arg) for arg in argv[:head]] + argv[head:]
  _check_config_file(argv)
  unset = [arg for arg in argv[:head] if _UNSET.match(arg)]
  try:
    parsed = flags.FLAGS([arg for arg in argv if arg not in unset])
  except flags.Error as e:
    fail(_with_unset_hint(_user_message(e) or _one_line(str(e)), argv))
  except (AttributeError, KeyError) as e:  # ml_collections: an override names no config key
    fail(_unknown_key_message(_key_of(e), argv))
  except Exception as e:  # pylint: disable=broad-except  # raised by the config file's code
    fail(_config_code_message(e, argv))
  _check_config_value(argv)
  for arg in unset:
    _unset_key(arg, argv)
  return parsed


# `--config.KEY=None`: the key unset (ml_collections would parse None as the key's type), e.g.
# `--config.total_steps=None --config.total_epochs=10` to switch a recipe to epochs. Only Python's
# spelling unsets: `none` is a value of several keys (model.remat, model.posemb).
_UNSET = re.compile(rf'^--config\.([A-Za-z_][\w.]*)=({"|".join(UNSET_SPELLINGS)})$')


def _with_unset_hint(message: str, argv) -> str:
  """A value refused for its type that looks like a try at unsetting the key (`none`, `null`)
  gets the spelling that does unset it."""
  for arg in argv:
    match = re.match(r'^--config\.([A-Za-z_][\w.]*)=(none|null|NULL|NONE|nil)$', arg)
    if match and arg in message:
      return (f'{message} (to unset {match.group(1)}, spell it '
              f'--config.{match.group(1)}={UNSET_SPELLINGS[0]})')
  return message


def _unset_key(arg: str, argv) -> None:
  """Sets the key of `--config.KEY=None` to None; only a key whose default is None (an optional
  value, a placeholder) may be unset."""
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  key = _UNSET.match(arg).group(1)
  node = flags.FLAGS['config'].value if 'config' in flags.FLAGS else None
  *parents, leaf = key.split('.')
  for part in parents:
    node = node.get(part) if isinstance(node, config_dict.ConfigDict) else None
  if not isinstance(node, config_dict.ConfigDict) or leaf not in node:
    fail(_unknown_key_message(key, argv))
  if not isinstance(node._fields[leaf], config_dict.FieldReference):  # pylint: disable=protected-access
    fail(f'{arg}: {key} always has a value (only the keys whose default is None can be unset): '
         f'give it a value, see configs/README.md')
  node[leaf] = None


def _config_code_message(error: BaseException, argv) -> str:
  """One line for a --config file whose code fails when it is loaded or run (it imports a module
  that is not installed, its get_config raises)."""
  path = (_config_value(argv) or '').partition(':')[0]
  if isinstance(error, ModuleNotFoundError):
    return (f'the --config file {path} imports {error.name!r}, which is not installed: install it '
            f'or remove the import')
  return (f'the --config file {path} failed when loaded ({type(error).__name__}: '
          f'{_one_line(str(error))[:200]}): fix it there')


def _check_config_value(argv) -> None:
  """A --config file whose get_config() returns something other than a ConfigDict: one line."""
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  if 'config' not in flags.FLAGS or _config_value(argv) is None:
    return
  value = flags.FLAGS['config'].value
  if not isinstance(value, config_dict.ConfigDict):
    path = _config_value(argv).partition(':')[0]
    fail(f'the --config file {path} returns {type(value).__name__} from get_config(), not a '
         f'ConfigDict: return one, as configs/default.py does')


def _config_value(argv) -> str | None:
  """The value of --config (`--config=V` or `--config V`), if given."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      return arg.split('=', 1)[1]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _check_config_file(argv) -> None:
  """One line for a --config file that cannot be loaded (ml_collections would raise later, with a
  traceback): missing, a directory, not valid Python, or without a get_config function."""
  value = _config_value(argv)
  if value is None or 'config' not in flags.FLAGS:
    return
  path = value.partition(':')[0]
  fix = f'pass --config=<file.py>, e.g. --config={_shipped_config(path)} (see configs/README.md)'
  if not os.path.exists(path):
    where = '' if os.path.isabs(path) else f' (relative to the working directory {os.getcwd()})'
    fail(f'the --config file {path} does not exist{where}: {fix}')
  if not os.path.isfile(path):
    fail(f'the --config file {path} is not a file: {fix}')
  try:
    with open(path, 'rb') as f:
      tree = ast.parse(f.read(), path)
  except SyntaxError as e:
    fail(f'the --config file {path} is not valid Python ({e.msg}, line {e.lineno}): fix it there')
  except (OSError, ValueError) as e:
    fail(f'cannot read the --config file {path} ({getattr(e, "strerror", None) or e}): {fix}')
  if not _defines(tree, 'get_config'):
    fail(f'the --config file {path} defines no get_config(): a config file returns its '
         f'ConfigDict from get_config(arg=None), as configs/default.py does')


def _shipped_config(path: str) -> str:
  """The checkout's config file of `path`'s name (configs/default.py when it has none), as a
  path that works from the working directory: `configs/NAME` in the checkout, else absolute."""
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
  shipped = os.path.join(folder, os.path.basename(path))
  if not os.path.isfile(shipped):
    shipped = os.path.join(folder, 'default.py')
  if not os.path.isfile(shipped):  # an installed package without the checkout's configs/
    return 'configs/default.py'
  relative = os.path.join('configs', os.path.basename(shipped))
  return relative if os.path.abspath(relative) == shipped else shipped


def _defines(tree: ast.Module, name: str) -> bool:
  """Whether a module's top level defines or imports `name` (or star-imports: cannot tell)."""
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
        node.name == name):
      return True
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
        (a.asname or a.name.split('.')[0]) in (name, '*') for a in node.names):
      return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in [
        t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)]:
      return True
  return False


def _key_of(error: BaseException) -> str:
  """The key ml_collections could not find: the first quoted word of its message."""
  while error.args and isinstance(error.args[0], BaseException):  # AttributeError(KeyError(...))
    error = error.args[0]
  text = str(error.args[0]) if error.args else str(error)
  match = re.search(r"['\"]([^'\"]+)['\"]", text)
  return match.group(1) if match else text.split()[0]


def _one_line(message: str) -> str:
  return ' '.join(message.split())


def _user_message(error: BaseException) -> str | None:
  """The UserError behind a flag error (config files are parsed inside flag parsing)."""
  found, seen = None, error
  while seen is not None:  # the deepest one: ml_collections re-raises it with a traceback text
    if isinstance(seen, UserError):
      found = str(seen)
    seen = seen.__cause__ or seen.__context__
  if found is not None and 'Traceback' not in found:
    return found
  marker = 'UserError: '
  for line in reversed(str(error).splitlines()):
    if marker in line:
      return line.split(marker, 1)[1]
  return None


# Names other ViT codebases use for what this schema calls otherwise (for "did you mean").
_OTHER_NAMES = {
    'base_lr': 'lr', 'learning_rate': 'lr', 'wd': 'weight_decay', 'epochs': 'total_epochs',
    'num_epochs': 'total_epochs', 'steps': 'total_steps', 'num_steps': 'total_steps',
    'warmup': 'warmup_steps', 'grad_clip': 'grad_clip_norm', 'clip_grad_norm': 'grad_clip_norm',
    'model': 'model_name', 'variant': 'model_name', 'batch': 'batch_size',
    'dropout': 'model.dropout_rate', 'drop_path': 'model.stochastic_depth',
    'pool_type': 'model.classifier', 'rep_size': 'model.representation_size',
    'optim': 'optimizer', 'schedule': 'decay_type', 'accum': 'accum_steps',
}


def _unknown_key_message(key: str, argv) -> str:
  arg = next((a for a in argv if a.startswith('--config.') and key in a.split('=')[0]), key)
  message = f'unknown config key in {arg}'
  known = _config_keys(argv)
  name = arg.split('=')[0][len('--config.'):]
  close = difflib.get_close_matches(name, known, n=3)
  other = _OTHER_NAMES.get(name.rsplit('.', 1)[-1])
  if other and other in known and other not in close:
    close = [other] + close[:2]
  hint = f'did you mean {", ".join(close)}? ' if close else ''
  return f'{message}: {hint}every key is listed in configs/README.md'


def _config_keys(argv) -> list[str]:
  """Every key of the config file named by --config (for did-you-mean hints); [] if unknown."""
  value = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), None)
  if value is None:
    return []
  path, _, arg = value.partition(':')
  try:
    spec = importlib.util.spec_from_file_location('_config_for_hint', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(*([arg] if arg else []))
  except Exception:  # pylint: disable=broad-except  # only a hint: never mask the real error
    return []
  return _flat_keys(config)


def _flat_keys(config, prefix: str = '') -> list[str]:
  out = []
  for key, value in config.items():
    out += _flat_keys(value, f'{prefix}{key}.') if hasattr(value, 'items') else [prefix + key]
  return out


class _NotFromOrbax:

  def filter(self, record) -> bool:
    return f'{os.sep}orbax{os.sep}' not in record.pathname


def run_main(fn, *, required_flags=(), compilation_cache: bool = True) -> None:
  """app.run(fn) with flag errors and UserErrors turned into one line and exit code 2, and a
  command line that asks for its usage (--help) ending with exit code 0 (absl's is 1).

  First, once per process, it restarts with huge-page malloc where that helps
  (vit_jax/platform/hostmem.py), SIGINT held across the restart (vit_jax/interrupt.py). Output
  that meets a closed reader is dropped; output that meets a full file is dropped too, and a
  command that otherwise succeeded then ends with one error line naming the file (exit 2). TensorFlow is imported quietly where a command needs it
  (platform/tf_import.py), and the persistent XLA compilation cache is on
  (platform/compile_cache.py) unless `compilation_cache=False` (the benchmark, which times cold
  compiles).
  """
  try:
    interrupt.install()  # (again: for entry points that did not) streams closed at start opened
    with interrupt.held():  # a Ctrl-C from here on outlives the restart
      hostmem.restart_with_hugepages()
  except KeyboardInterrupt:
    fail('interrupted (Ctrl-C): rerun the same command')
  interrupt.survive_closed_output()  # `... | head -1`, a closed terminal or a full disk never
  #                                    stops a run
  for name in required_flags:
    flags.mark_flag_as_required(name)
  # The command's own flags (those its module asked for), which error messages name.
  errors.COMMAND_FLAGS.update(f.name for f in flags.FLAGS.get_key_flags_for_module(sys.argv[0]))

  def guarded(argv):
    interrupt.check()  # a Ctrl-C while the command's modules were imported
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.ERROR)  # library INFO/WARNING chatter off unless asked for
      # orbax logs a failed background write at ERROR with its traceback, then raises it in the
      # caller, which turns it into one line; the log would only repeat it.
      logging.get_absl_handler().addFilter(_NotFromOrbax())
    tf_import.quiet_when_needed()
    if compilation_cache:
      compile_cache.enable()
    try:
      return fn(argv)
    except UserError as e:
      fail(str(e), quiet_after=True)
    except Exception as e:  # a full disk, a missing permission, ...: one line; a bug: traceback
      line = errors.environment_failure(e)
      if line is None:
        raise
      fail(line, quiet_after=True)

  try:
    app.run(guarded, flags_parser=_parse_flags)
  except KeyboardInterrupt:  # a Ctrl-C the command did not handle itself (start-up, imports)
    fail('interrupted (Ctrl-C): rerun the same command')
  except SystemExit as e:
    if e.code == 1 and asks_for_help(sys.argv):  # absl printed the usage asked for: not a failure
      raise SystemExit(0) from None
    lost = interrupt.lost_output()
    if lost and e.code in (0, None):  # the command ran to its end; what it printed did not
      fail(f'cannot write {lost}: the command ran to its end, and what it printed from then on '
           'was dropped; free space there, or send its output elsewhere')
    raise


def asks_for_help(argv) -> bool:
  """Whether a command line asks for its usage: a help flag before any `--` (what follows `--`
  is another command's, as in `launch ... -- python3 -m vit_jax.main --help`)."""
  return any(arg in HELP_FLAGS for arg in _flag_part(list(argv[1:])))


__all__ = ['UserError', 'as_flags', 'asks_for_help', 'fail', 'run_main', 'EXIT_USER_ERROR',
           'HELP_FLAGS']
