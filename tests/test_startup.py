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


def _fake_run(root, evals):
  """A run directory whose step 4 holds a stored config with `evals` entries (no params)."""
  step = root / 'checkpoints' / '4'
  (step / 'state').mkdir(parents=True)
  (step / 'config').mkdir()
  (step / 'config' / 'metadata').write_text(json.dumps({'evals': evals}))
  return root


@pytest.mark.parametrize('command, error', [
    ('fewshot --workdir={missing} --dataset=cifar100 --shots=1,5',
     'error: --workdir={missing} does not exist: pass the --workdir of a training run'),
    ('fewshot --workdir={empty}', 'error: no checkpoints in {empty}/checkpoints: train first'),
    ('evaluate --workdir={missing} --evals=knn', 'error: --workdir={missing} does not exist'),
    ('evaluate --workdir={run} --evals=knn,nosuch',
     "error: unknown evaluator 'nosuch': use one of fewshot, knn, linear_probe, mine, real, "
     'robustness'),
    ('evaluate --workdir={empty} --weights={params} --model=ViT-Ti/16 --evals=nosuch',
     "error: unknown evaluator 'nosuch': use one of eval, fewshot, knn, linear_probe, real,"),
    ('predict --workdir={missing} image.png', 'error: --workdir={missing} does not exist'),
    ('predict --workdir={run} --checkpoint=9 image.png',
     'error: no checkpoint for step 9 in {run}/checkpoints: available steps are 4'),
    ('predict --bundle={empty} image.png', 'error: --bundle={empty} is not a bundle (no model.json)'),
    ('predict --checkpoint={missing}.npz --model=ViT-Ti/16 image.png',
     'error: checkpoint {missing}.npz does not exist'),
    ('export --workdir={empty} --out={missing}', 'error: no checkpoints in {empty}/checkpoints'),
    ('convert --checkpoint={missing}.safetensors --out={missing}.npz',
     'error: checkpoint {missing}.safetensors does not exist'),
    ('analyze --workdir={missing} --out={empty}/figures', 'error: --workdir={missing} does not'),
    ('evaluate --workdir={run} --evals=knn --dataset=mnist5k', 'error: --dataset is for --weights'),
    ('evaluate --workdir={empty} --weights={missing}.npz --model=ViT-Ti/16 --evals=knn',
     'error: --weights={missing}.npz is neither a released name (python -m vit_jax weights lists '
     'them) nor a params file'),
    ('predict --workdir={run} {missing}.png {empty}',
     'error: cannot read image {missing}.png: no such file; pass PNG or JPEG files (and 1 more: '
     '{empty}); nothing was printed'),
    ('analyze --workdir={run} --out={empty}/figures {missing}.png',
     'error: cannot read image {missing}.png: no such file; pass PNG or JPEG files'),
])
def test_the_commands_say_a_missing_run_or_file_before_the_heavy_imports(tmp_path, command,
                                                                         error):
  paths = dict(missing=str(tmp_path / 'no_such_dir'), empty=str(tmp_path / 'empty'),
               run=str(_fake_run(tmp_path / 'run', {'mine': {'type': 'knn'}})),
               params=str(tmp_path / 'params.npz'))
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'params.npz').write_bytes(b'')  # a file: read only after the heavy imports
  code, stderr, modules = _run(tmp_path, '-m', 'vit_jax', *command.format(**paths).split())
  assert code == 2, stderr
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(error.format(**paths)), stderr
  assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_the_evaluator_entries_of_a_run_are_read_from_its_stored_configs(tmp_path):
  """`evaluate` refuses a name before loading the run only when no step's stored config has it:
  an entry of an older step (read when the newest is damaged) is let through."""
  from vit_jax.checkpoint import steps  # pylint: disable=g-import-not-at-top
  from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import registry  # pylint: disable=g-import-not-at-top
  run = _fake_run(tmp_path / 'run', {'mine': {'type': 'knn'}})
  (run / 'checkpoints' / '8' / 'state').mkdir(parents=True)
  (run / 'checkpoints' / '8' / 'config').mkdir()
  (run / 'checkpoints' / '8' / 'config' / 'metadata').write_text(
      json.dumps({'evals': {'theirs': {'type': 'knn'}}}))
  assert steps.evals_entries(str(run), None) == {'mine', 'theirs'}
  assert steps.evals_entries(str(run), '8') == {'theirs'}
  registry.refuse_unknown(['mine', 'knn', 'robustness'], steps.evals_entries(str(run), None))
  with pytest.raises(UserError, match="unknown evaluator 'mine'"):
    registry.refuse_unknown(['mine'], steps.evals_entries(str(run), '8'))
  (run / 'checkpoints' / '8' / 'config' / 'metadata').write_text('{not json')
  assert steps.evals_entries(str(run), None) is None  # the run's own load says what is wrong
