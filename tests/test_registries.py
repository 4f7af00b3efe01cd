"""The two registries from a user's side: configs/extending.py registers a preprocessing op and
an evaluator and a run uses both; the docs show that file's code and list every registered op
and evaluator (each table is the registry's own, so a test fails when they differ)."""

import importlib.util
import json
import os
import re

import numpy as np
import pytest

from helpers import ROOT
from vit_jax import data
from vit_jax.data import ops, specs
from vit_jax.errors import UserError
from vit_jax.evaluate import registry
from vit_jax.train import loop, validate


def _doc(name):
  with open(os.path.join(ROOT, 'docs', name)) as f:
    return f.read()


@pytest.fixture
def extending():
  """configs/extending.py loaded (registering `brightness` and `confidence`), and unregistered
  after the test, so the registries hold the built-in entries only for every other test."""
  spec = importlib.util.spec_from_file_location(
      'extending_under_test', os.path.join(ROOT, 'configs', 'extending.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    yield module
  finally:
    ops.OPS.unregister('brightness')
    registry.EVALUATORS.unregister('confidence')


def test_a_config_registers_an_op_and_an_evaluator_and_a_run_uses_both(extending, tmp_path,
                                                                         capsys):
  config = extending.get_config('model_name=ViT-Ze/4,steps=4,batch_size=16')
  config.warmup_steps, config.eval_every, config.progress = 1, 2, False
  config.eval_split = 'test[:64]'
  validate.check_config(config)
  bad = extending.get_config()
  bad.evals.confidence.type = 'confidense'
  with pytest.raises(UserError, match=r"^unknown evaluator type 'confidense' in "
                                      r'config.evals.confidence.type: use one of confidence, '
                                      r'fewshot, knn'):
    validate.check_config(bad)
  bad = extending.get_config()
  bad.pp.train = 'pad_crop(pad=2)|brightness(delta=40, gamma=2)'
  with pytest.raises(UserError, match=r"unexpected keyword argument 'gamma'"):
    validate.check_config(bad)

  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  confidence = [(r['step'], r['confidence']) for r in rows if r['split'] == 'confidence']
  assert [step for step, _ in confidence] == [2, 4]
  assert all(0.1 <= value <= 1.0 for _, value in confidence), confidence
  said = capsys.readouterr().err
  assert f'step 2: confidence {confidence[0][1]:.4f}\n' in said, said
  assert 'confidence confidence' not in said

  # The evaluate command's library scores the checkpoint on the config's own entry and k-NN,
  # writes the table, and a rerun finds both in it.
  from vit_jax.evaluate import checkpoint  # pylint: disable=g-import-not-at-top
  model, params, stored, identity = checkpoint.load_run_checkpoint(workdir, None)
  lines = []
  out = checkpoint.evaluate(model, params, stored, identity, ['confidence', 'knn'],
                            workdir=workdir, say=lines.append)
  assert identity['step'] == 4 and sorted(out['results']) == ['confidence', 'knn']
  assert out['results']['confidence']['metrics']['confidence'] == pytest.approx(
      confidence[-1][1], abs=1e-5)
  assert 0.0 <= out['results']['knn']['metrics']['top1'] <= 1.0
  assert out['results']['knn']['dataset']['name'] == 'mnist5k'
  for name in ('results.json', 'results.md', 'results.png'):
    assert os.path.isfile(os.path.join(out['directory'], name)), name
  lines.clear()
  checkpoint.evaluate(model, params, stored, identity, ['confidence', 'knn'], workdir=workdir,
                      say=lines.append)
  assert lines == ['confidence: in the table already (step 4)', 'knn: in the table already '
                   '(step 4)']
  with pytest.raises(UserError, match=r"^unknown evaluator 'knm': use one of confidence, eval, "):
    checkpoint.evaluate(model, params, stored, identity, ['knm'], workdir=workdir)


  # The train stream runs the op: each image's background (0 in mnist5k) is shifted by one amount
  # in [0, 40] (negative shifts clip to 0), different between images.
  plain = specs.train_spec('pad_crop(pad=2)', config.image_size)
  batches = [next(data.train_iterator(dataset='mnist5k', split='train', batch_size=32, seed=0,
                                      spec=spec)) for spec in (specs.of_config(config).train,
                                                                plain)]
  shifts = []
  for image, raw in zip(*(np.round(b['image'] * 127.5 + 127.5).astype(int) for b in batches)):
    level = np.unique(image[raw == 0])
    assert len(level) == 1 and 0 <= level[0] <= 40
    shifts.append(int(level[0]))
  assert len(set(shifts)) > 5

  # The same params as a local weights file: scored by name of the file, on a dataset named.
  from vit_jax.formats import npz  # pylint: disable=g-import-not-at-top
  weights = str(tmp_path / 'ze.npz')
  npz.save_npz(weights, params)
  with pytest.raises(UserError, match=r'carries no dataset: pass --dataset=NAME'):
    checkpoint.load_weights(weights, 'ViT-Ze/4', None)
  model, params, base, identity = checkpoint.load_weights(weights, 'ViT-Ze/4', 'mnist5k')
  assert identity['weights'] == weights and len(identity['content']) == 16
  out = checkpoint.evaluate(model, params, base, identity, ['knn'], workdir=str(tmp_path / 'w'),
                            say=lines.append)
  assert out['directory'].endswith('weights_' + weights.replace('/', '_'))
  assert 0.0 <= out['results']['knn']['metrics']['top1'] <= 1.0

  # The checkpoint records the file that registered the op; a reader of the checkpoint in a
  # process that has not loaded it (predict, fewshot, export) registers it from there.
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  from vit_jax.serving import bundle  # pylint: disable=g-import-not-at-top
  step_dir = os.path.join(workdir, 'checkpoints', str(restore.available_steps(workdir)[-1]))
  source = os.path.join(ROOT, 'configs', 'extending.py')
  assert restore.load_facts(step_dir)['ops'] == {'brightness': source}
  ops.OPS.unregister('brightness')
  assert bundle.from_workdir(workdir).op_sources == {'brightness': source}
  assert 'brightness' in ops.OPS
  with pytest.raises(UserError, match=r"^RUN uses the preprocessing op 'gone' registered by "
                                      r'/nonexistent/ops.py, which is gone: put that file back$'):
    ops.OPS.load_sources({'gone': '/nonexistent/ops.py'}, 'RUN')


def test_the_docs_show_the_registering_code_of_configs_extending():
  """Each registered function docs/data.md and docs/evaluation.md show is configs/extending.py's."""
  with open(os.path.join(ROOT, 'configs', 'extending.py')) as f:
    code = f.read()
  shown = {name: re.findall(r'```python\n(.*?)```', _doc(name), re.S)
           for name in ('data.md', 'evaluation.md')}
  registering = [(name, block) for name, blocks in shown.items() for block in blocks
                 if '.register(' in block]
  assert [name for name, _ in registering] == ['data.md', 'evaluation.md']
  for name, block in registering:
    assert block in code, f'docs/{name} shows code that configs/extending.py does not hold'


@pytest.mark.parametrize('doc, table', [('data.md', ops.table), ('evaluation.md', registry.table)],
                         ids=['ops', 'evaluators'])
def test_the_docs_list_every_registered_entry(doc, table):
  """The table in the docs is the registry's (regenerate it with `ops.table()` or
  `vit_jax.evaluate.registry.table()` after adding one)."""
  assert table() in _doc(doc), f'docs/{doc} should hold this table:\n{table()}'
