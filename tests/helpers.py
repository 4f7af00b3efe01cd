"""Helpers the test modules share (fixtures are in conftest.py): the repository root, a free
loopback port, a run's metrics log, a sweep spec file, and XLA's optimisations for the tests that
train longer (in-process or in a subprocess)."""

import contextlib
import json
import os
import shutil
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (for a coordinator or a server)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def xla_flags(devices: int) -> str:
  """The suite's XLA_FLAGS (conftest.py) with `devices` simulated CPU devices instead of 8, for a
  subprocess that needs another device count."""
  kept = [f for f in os.environ.get('XLA_FLAGS', '').split()
          if not f.startswith('--xla_force_host_platform_device_count=')]
  return ' '.join([*kept, f'--xla_force_host_platform_device_count={devices}'])


def file_tree(directory) -> dict:
  """{relative path: bytes} of every file under `directory`: to check that nothing changed."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), directory)] = f.read()
  return out


def cut_run(full: str, cut: str, *, keep_step: int, drop_step: int) -> None:
  """`cut`: a copy of the finished run `full` as it stood after step `keep_step`'s checkpoint
  (checkpoint `drop_step` and the log records after `keep_step` removed), as a killed run leaves
  its workdir."""
  shutil.copytree(full, cut)
  shutil.rmtree(os.path.join(cut, 'checkpoints', str(drop_step)))
  with open(os.path.join(cut, 'metrics.jsonl')) as f:
    kept = [line for line in f if json.loads(line)['step'] <= keep_step]
  with open(os.path.join(cut, 'metrics.jsonl'), 'w') as f:
    f.writelines(kept)


def records(workdir, split=None) -> list:
  """The records of a run's metrics.jsonl, in order (only those of `split` if given)."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r for r in map(json.loads, f) if split is None or r['split'] == split]


def train_losses(workdir) -> list:
  """The train losses a run logged, in step order."""
  return [r['loss'] for r in records(workdir, 'train')]


def write_sweep_spec(directory, data_dir, *, steps: int, grid: dict, overrides: str = '',
                     extra: str = '') -> str:
  """Writes `directory`/sweep.py, a sweep of ViT-Ze/4 runs of `steps` steps (batch 32) on mnist5k
  in `data_dir` over `grid`, and returns its path. `overrides` and `extra` are Python source
  spliced in: more config overrides ("'eval_every': 4, ") and more keys of the spec ("'select':
  None,")."""
  path = os.path.join(str(directory), 'sweep.py')
  with open(path, 'w') as f:
    f.write(f"""
def get_sweep():
  return {{
      'config': 'configs/mnist5k.py:model_name=ViT-Ze/4,steps={steps},batch_size=32',
      'overrides': {{'warmup_steps': 1, 'data_dir': {str(data_dir)!r}, 'progress': False,
                    {overrides}}},
      'grid': {grid!r},
      {extra}
  }}
""")
  return path


# The suite compiles with most of XLA's optimisations off (conftest.py): right for its many
# small programs, about twice the CPU time for a run of 100+ steps.
@contextlib.contextmanager
def optimized():
  """Programs compiled inside get XLA's optimisations (the suite's default is off; LLVM at level 1,
  conftest.py)."""
  import jax  # pylint: disable=g-import-not-at-top
  before = jax.config.read('jax_disable_most_optimizations')
  jax.config.update('jax_disable_most_optimizations', False)
  try:
    yield
  finally:
    jax.config.update('jax_disable_most_optimizations', before)


def optimized_env() -> dict:
  """The environment for a subprocess whose programs get XLA's optimisations (as `optimized()`
  does in-process): for a run whose running, not its compiling, is the time."""
  return dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS='0')
