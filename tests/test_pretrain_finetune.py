"""End to end: masked-patch-prediction pre-training, then fine-tuning from it with the recipe
options on (mixup, Polyak averaging, periodic few-shot evaluation), then the few-shot CLI on the
result. (RandAugment in the input pipeline: tests/test_augment.py.)"""

import os
import subprocess
import sys

import numpy as np

from vit_jax.configs import finetune, pretrain
from vit_jax import tasks
from vit_jax.checkpoint import restore
from vit_jax.serving import bundle as bundle_lib
from vit_jax.train import loop
from helpers import ROOT, records



def _check_export_is_the_trained_model(config, workdir, params, out):
  """The exported bundle of a run (saved and loaded back) computes what the trained model does:
  for masked patch prediction, per-token colour logits (the task's model, not a pooled head)."""
  bundle_lib.save(bundle_lib.from_workdir(workdir), out)
  exported = bundle_lib.load(out)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 1)).astype(np.float32)
  trained = tasks.get_task(config).build_model(num_classes=8).apply({'params': params}, images, train=False)
  served = exported.spec.build().apply({'params': exported.params}, images, train=False)
  assert trained.shape == (2, 50, 8)  # the class token and a 7x7 grid of patches, 8 colours each
  np.testing.assert_allclose(np.asarray(served), np.asarray(trained), rtol=1e-5, atol=1e-5)


def test_mpp_pretrain_then_finetune_then_fewshot_cli(tmp_path, data_dir):
  pre = pretrain.get_config('model=Ze/4,dataset=mnist5k,steps=50,lr=3e-3')
  pre.loss = 'mpp'
  pre.data_dir, pre.progress = data_dir, False
  pre.log_every, pre.eval_every, pre.checkpoint_every = 10, 50, 50
  pre_dir = str(tmp_path / 'mpp')
  result = loop.train_and_evaluate(pre, pre_dir)
  losses = [r['loss'] for r in records(pre_dir, 'train')]
  assert len(losses) == 5 and losses[-1] < 0.6 * losses[0], losses  # from ~log(8) = 2.08
  assert 0.5 < result['accuracy'] <= 1.0  # patch-colour accuracy on the test images
  params, _ = restore.load_checkpoint(restore.resolve_checkpoint(pre_dir))
  assert params['mask_token'].shape == (1, 1, 32) and params['head']['kernel'].shape == (32, 8)
  assert 'pre_logits' in params
  _check_export_is_the_trained_model(pre, pre_dir, params, str(tmp_path / 'mpp_bundle'))

  ft = finetune.get_config('model=Ze/4,dataset=mnist5k,steps=60,image_size=36,lr=0.1')
  ft.data_dir, ft.progress, ft.init = data_dir, False, pre_dir
  ft.mixup, ft.polyak_decay = 0.2, 0.9
  ft.evals.fewshot.every, ft.evals.fewshot.shots = 30, (1, 5)
  ft.log_every, ft.eval_every, ft.checkpoint_every = 30, 30, 30
  ft_dir = str(tmp_path / 'ft')
  result = loop.train_and_evaluate(ft, ft_dir)
  # Chance is 0.1; with mixup and the lagging average this short run measured 0.263.
  assert result['count'] == 1000 and result['accuracy'] > 0.15, result
  first, _ = restore.load_checkpoint(restore.resolve_checkpoint(ft_dir, '30'))
  assert not {'mask_token', 'pre_logits'} & set(first)
  assert first['head']['kernel'].shape == (32, 10)
  assert first['Transformer']['posembed_input']['pos_embedding'].shape == (1, 82, 32)
  fewshot = records(ft_dir, 'fewshot')
  assert [r['step'] for r in fewshot] == [30, 60]
  assert all(0.1 < r['5shot'] <= 1.0 and 0.0 <= r['1shot'] <= 1.0 for r in fewshot)

  # Rerunning the finished fine-tune resumes from its own checkpoint: config.init is not read.
  os.rename(pre_dir, pre_dir + '.moved')
  assert loop.train_and_evaluate(ft, ft_dir) == result

  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'fewshot', f'--workdir={os.path.relpath(ft_dir, ROOT)}',
       '--shots=1,5',
       f'--data_dir={data_dir}', '--batch_size=200'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert [l.split(':')[0] for l in lines] == ['mnist5k 1-shot top-1', 'mnist5k 5-shot top-1']
  # The CLI scores the Polyak average, as the loop did at its last step.
  accuracies = [float(l.split(': ')[1].split()[0]) for l in lines]
  np.testing.assert_allclose(accuracies, [fewshot[-1]['1shot'], fewshot[-1]['5shot']], atol=2e-3)
