"""Saying no at once: a config, flag or path mistake is printed before JAX, TensorFlow or orbax is
imported, and the trainer's modules load without TensorFlow (the input pipeline imports it).

Each case runs the real command in a subprocess whose `sitecustomize` records, at exit, which
heavy modules were imported (the command restarts itself for huge pages; the hook runs in the
restarted process too).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ('jax', 'flax', 'optax', 'orbax', 'tensorflow')

_HOOK = textwrap.dedent('''
    import atexit, json, os, sys
    def _report():
        with open(os.environ['VIT_JAX_TEST_MODULES'], 'w') as f:
            json.dump(sorted(m for m in sys.modules if '.' not in m), f)
    atexit.register(_report)
''')


def _run(tmp_path, *args):
  """(return code, stderr, top-level modules imported) of `python <args>` with the hook."""
  (tmp_path / 'hook').mkdir(exist_ok=True)
  (tmp_path / 'hook' / 'sitecustomize.py').write_text(_HOOK)
  report = tmp_path / 'modules.json'
  env = dict(os.environ, PYTHONPATH=str(tmp_path / 'hook'), VIT_JAX_TEST_MODULES=str(report))
  proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                        timeout=300, check=False)
  return proc.returncode, proc.stderr, set(json.loads(report.read_text()))


@pytest.mark.parametrize('override, error', [
    ('--config.model_name=ViT-Q/3', "error: unknown model 'ViT-Q/3': use ViT-<base>/<patch>"),
    ('--config.nosuchkey=1', 'error: unknown config key in --config.nosuchkey=1'),
    ('--config.dataset=cifar10 --config.data_dir={missing}',
     "error: dataset 'cifar10' is not prepared: tfds looked in {missing}/cifar10"),
    ('--config.lr=-1', 'error: --config.lr=-1.0 is out of range'),
    ('--config.model.posemb=rope', "error: unknown posemb 'rope': use --config.model.posemb="),
    ('--config.warmup_steps=5000', 'error: warmup_steps=5000 is not below total_steps=3000'),
    ('--config.flexi_patch_sizes=4,7',
     'error: --config.flexi_patch_sizes=4,7 draws a patch size per step, which needs a FlexiViT'),
])
def test_config_errors_come_before_the_heavy_imports(tmp_path, override, error):
  missing = str(tmp_path / 'no_such_dir')
  code, stderr, modules = _run(
      tmp_path, '-m', 'vit_jax.main', '--config=configs/default.py',
      *override.format(missing=missing).split(), f'--workdir={tmp_path / "run"}')
  assert code == 2, stderr
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(error.format(missing=missing)), stderr
  assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
  assert not (tmp_path / 'run').exists()  # nothing written


def test_the_trainer_loads_without_tensorflow(tmp_path):
  """The train command's modules, the program builder and the evaluators import JAX but not
  TensorFlow: it loads when the input pipeline is built (vit_jax/data/pipeline.py)."""
  code, stderr, modules = _run(tmp_path, '-c', 'import vit_jax.commands.train, '
                               'vit_jax.train.loop, vit_jax.train.program, '
                               'vit_jax.evaluate.registry')
  assert code == 0, stderr
  assert 'jax' in modules and 'tensorflow' not in modules
