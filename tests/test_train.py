"""Trainer pieces: schedules, optimizers, losses, and the pure train/eval steps."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.configs import common
from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.tasks import classification, losses
from vit_jax.train import optim, step as step_lib
from helpers import ROOT


def _config(**overrides):
  c = common.base_config()
  for k, v in overrides.items():
    c[k] = v
  return c


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize('decay_type', ['linear', 'cosine'])
def test_schedule_warmup_then_decay(decay_type):
  s = optim.make_schedule(lr=1e-3, total_steps=1000, warmup_steps=100, decay_type=decay_type)
  assert float(s(0)) == 0.0  # the first update uses lr 0, as the original
  np.testing.assert_allclose(float(s(50)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(s(100)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(s(550)), 5e-4, rtol=1e-5)  # half-way: both give half
  np.testing.assert_allclose(float(s(1000)), 0.0, atol=1e-12)
  quarter = float(s(325))
  expected = 7.5e-4 if decay_type == 'linear' else 1e-3 * 0.5 * (1 + np.cos(np.pi * 0.25))
  np.testing.assert_allclose(quarter, expected, rtol=1e-5)


def test_schedule_lr_end_and_bad_values():
  s = optim.make_schedule(lr=1.0, total_steps=10, warmup_steps=0, decay_type='linear', lr_end=0.1)
  np.testing.assert_allclose(float(s(10)), 0.1, rtol=1e-6)
  np.testing.assert_allclose(float(s(0)), 1.0, rtol=1e-6)
  with pytest.raises(UserError, match='decay_type'):
    optim.make_schedule(lr=1.0, total_steps=10, warmup_steps=0, decay_type='step')
  with pytest.raises(UserError, match='warmup_steps'):
    optim.make_schedule(lr=1.0, total_steps=10, warmup_steps=10, decay_type='linear')


@pytest.mark.parametrize('decay_type', ['linear', 'cosine'])
@pytest.mark.parametrize('warmup', [0, 7])
def test_schedule_of_traced_hyperparameters_equals_the_constant_one(decay_type, warmup):
  """The train step's schedule reads its values from its arguments (one compiled program for
  every learning rate): bitwise the schedule of the same values as constants."""
  values = dict(lr=3e-3, lr_end=1e-5, warmup_steps=warmup, total_steps=50)
  steps = jnp.arange(0, 60)
  constant = jax.jit(jax.vmap(optim.make_schedule(decay_type=decay_type, **values)))(steps)
  hyper = {k: np.float32(v) for k, v in values.items()}
  traced = jax.jit(lambda h, s: jax.vmap(optim.schedule_of(decay_type, h))(s))(hyper, steps)
  np.testing.assert_array_equal(np.asarray(traced), np.asarray(constant))
  assert traced[0] == (0.0 if warmup else np.float32(3e-3))  # warmup starts at 0


def test_runs_differing_in_lr_schedule_and_weight_decay_lower_to_one_program():
  """What the persistent compilation cache keys on: the train step's program text. Changing the
  learning rate, its end value, the warmup, the step count or a non-zero weight decay changes
  only the step's arguments; turning weight decay off changes the program."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top

  def train_text(**overrides):
    c = mnist5k.get_config('model_name=ViT-Ze/4,steps=1000,batch_size=16')
    for k, v in overrides.items():
      c[k] = v
    prog = program.build_program(c, jax.devices()[:1], require_dataset=False)
    return prog.train_fn.lower(*prog.abstract_train_args()).as_text(), prog.hyper

  base, hyper = train_text()
  other, other_hyper = train_text(lr=0.123, lr_end=1e-4, warmup_steps=3, total_steps=77,
                                  weight_decay=0.05)
  assert other == base
  assert hyper != other_hyper and other_hyper['total_steps'] == np.float32(77)
  assert train_text(weight_decay=0.0)[0] != base


# ---------------------------------------------------------------- optimizers


def test_weight_decay_is_lr_times_wd_on_kernels_only():
  params = {'dense': {'kernel': jnp.full((2, 2), 2.0), 'bias': jnp.full((2,), 2.0)}}
  c = _config(optimizer='adam', weight_decay=0.1, grad_clip_norm=0.0)
  tx = optim.make_optimizer(c, lambda step: 0.5)
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  # Adam of a zero gradient is zero, so the update is the decay alone: -lr * wd * param.
  np.testing.assert_allclose(updates['dense']['kernel'], -0.5 * 0.1 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(updates['dense']['bias'], 0.0)
  c.weight_decay_mask = 'all'
  tx = optim.make_optimizer(c, lambda step: 0.5)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  np.testing.assert_allclose(updates['dense']['bias'], -0.1, rtol=1e-6)


def test_sgd_momentum_and_clipping():
  params = {'w': jnp.zeros((4,))}
  c = _config(optimizer='sgd', momentum=0.9, grad_clip_norm=1.0, weight_decay=0.0)
  tx = optim.make_optimizer(c, lambda step: 0.1)
  state = tx.init(params)
  g = {'w': jnp.full((4,), 10.0)}  # norm 20 -> clipped to norm 1: each entry 0.5
  u1, state = tx.update(g, state, params)
  np.testing.assert_allclose(u1['w'], -0.1 * 0.5, rtol=1e-6)
  u2, state = tx.update(g, state, params)
  np.testing.assert_allclose(u2['w'], -0.1 * (0.5 + 0.9 * 0.5), rtol=1e-6)
  with pytest.raises(UserError, match='optimizer'):
    optim.make_optimizer(_config(optimizer='lamb'), lambda step: 0.1)


def test_bf16_first_moment_keeps_second_moment_fp32():
  params = {'w': jnp.ones((3,))}
  tx = optim.make_optimizer(_config(optimizer='adam', mu_dtype='bfloat16'), lambda s: 1e-3)
  adam_state = [s for s in jax.tree.leaves(tx.init(params), is_leaf=lambda x: hasattr(x, 'nu'))
                if hasattr(s, 'nu')][0]
  assert adam_state.mu['w'].dtype == jnp.bfloat16
  assert adam_state.nu['w'].dtype == jnp.float32


# ---------------------------------------------------------------- losses


def test_softmax_xent_matches_numpy_and_smoothing():
  logits = jnp.array([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]])
  labels = jnp.array([0, 2])
  ref = -np.log(np.exp(2.0) / np.exp([2.0, 0.5, -1.0]).sum())
  out = losses.softmax_xent(logits, losses.one_hot(labels, 3))
  np.testing.assert_allclose(out, [ref, np.log(3.0)], rtol=1e-6)
  smooth = losses.one_hot(labels, 3, label_smoothing=0.3)
  np.testing.assert_allclose(smooth[0], [0.8, 0.1, 0.1], rtol=1e-6)
  np.testing.assert_allclose(smooth.sum(-1), 1.0, rtol=1e-6)


def test_sigmoid_xent_matches_numpy():
  logits = jnp.array([[3.0, -2.0]])
  targets = jnp.array([[1.0, 0.0]])
  sig = lambda x: 1 / (1 + np.exp(-x))
  ref = -(np.log(sig(3.0)) + np.log(1 - sig(-2.0)))
  np.testing.assert_allclose(losses.sigmoid_xent(logits, targets), [ref], rtol=1e-6)
  with pytest.raises(UserError, match='loss'):
    losses.get_loss('hinge')


# ---------------------------------------------------------------- steps


def _tiny_setup(accum_steps=1, optimizer='adam', lr=1e-3, dropout=0.0):
  model = models.create_model('ViT-Ze/4', num_classes=4, dropout_rate=dropout)
  c = _config(optimizer=optimizer, lr=lr, weight_decay=0.0, grad_clip_norm=1.0)
  schedule = lambda step: lr
  tx = optim.make_optimizer(c, schedule)
  images = jax.random.uniform(jax.random.PRNGKey(1), (16, 28, 28, 1), minval=-1, maxval=1)
  labels = jnp.arange(16) % 4
  params = model.init({'params': jax.random.PRNGKey(0)}, images[:1], train=False)['params']
  state = step_lib.TrainState.create(params, tx)
  step = step_lib.make_train_step(
      apply_fn=model.apply, optimizer=lambda hyper: (tx, schedule), loss_fn=losses.softmax_xent,
      num_classes=4, label_smoothing=0.0, accum_steps=accum_steps)
  train_step = lambda state, batch, rng: step(state, batch, rng, {})
  return model, state, train_step, {'image': images, 'label': labels}


@pytest.mark.slow
def test_train_step_lowers_loss_and_reports_health_metrics():
  _, state, train_step, batch = _tiny_setup(lr=3e-3)
  fn = jax.jit(train_step)
  first = None
  for _ in range(30):
    state, metrics = fn(state, batch, jax.random.PRNGKey(0))
    first = first if first is not None else float(metrics['loss'])
  assert int(state.step) == 30
  assert float(metrics['loss']) < 0.5 * first
  for k in ('grad_norm', 'param_norm', 'update_norm', 'lr', 'accuracy'):
    assert np.isfinite(float(metrics[k]))
  assert float(metrics['update_norm']) > 0
  assert fn._cache_size() == 1  # compiled once for all 30 steps


@pytest.mark.slow
def test_gradient_accumulation_matches_full_batch():
  _, s1, step1, batch = _tiny_setup(accum_steps=1, optimizer='sgd', lr=0.1)
  _, s4, step4, _ = _tiny_setup(accum_steps=4, optimizer='sgd', lr=0.1)
  s1, m1 = jax.jit(step1)(s1, batch, jax.random.PRNGKey(0))
  s4, m4 = jax.jit(step4)(s4, batch, jax.random.PRNGKey(0))
  np.testing.assert_allclose(m1['loss'], m4['loss'], rtol=1e-5)
  np.testing.assert_allclose(m1['grad_norm'], m4['grad_norm'], rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               s1.params, s4.params)


@pytest.mark.slow
def test_sharded_step_equals_single_device_step():
  assert jax.device_count() == 8
  _, state, train_step, batch = _tiny_setup(optimizer='sgd', lr=0.1)
  single_state, single_metrics = jax.jit(train_step)(state, batch, jax.random.PRNGKey(0))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ('data',))
  repl, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  fn = jax.jit(train_step, in_shardings=(repl, rows, repl), out_shardings=(repl, repl))
  sharded_state, sharded_metrics = fn(state, batch, jax.random.PRNGKey(0))
  np.testing.assert_allclose(single_metrics['loss'], sharded_metrics['loss'], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               single_state.params, sharded_state.params)


def test_dropout_rng_changes_with_step():
  _, state, train_step, batch = _tiny_setup(dropout=0.5)
  fn = jax.jit(train_step)
  _, m_a = fn(state, batch, jax.random.PRNGKey(0))
  _, m_b = fn(state.replace(step=state.step + 1), batch, jax.random.PRNGKey(0))
  _, m_c = fn(state, batch, jax.random.PRNGKey(0))
  # The head starts at zero, so the first loss is log(4) whatever the mask; the gradient is not.
  assert float(m_a['grad_norm']) != float(m_b['grad_norm'])  # a new dropout mask every step
  assert float(m_a['grad_norm']) == float(m_c['grad_norm'])  # the same mask for the same step


def test_eval_step_masks_padding():
  model, state, _, batch = _tiny_setup()
  eval_step = jax.jit(classification.make_eval_step(apply_fn=model.apply, loss_fn=losses.softmax_xent,
                                              num_classes=4))
  mask = (jnp.arange(16) < 10).astype(jnp.float32)
  out = eval_step(state.params, dict(batch, mask=mask))
  assert float(out['count']) == 10.0
  logits = model.apply({'params': state.params}, batch['image'][:10], train=False)
  expected = np.sum(np.argmax(logits, -1) == np.asarray(batch['label'][:10]))
  assert float(out['correct']) == expected
  ref_loss = losses.softmax_xent(logits, losses.one_hot(batch['label'][:10], 4)).sum()
  np.testing.assert_allclose(out['loss'], ref_loss, rtol=1e-5)


@pytest.mark.slow
def test_a_run_on_an_embedded_dataset_reads_it_in_place(tmp_path):
  """A whole run on mnist5k (workdir checked, a torn log repaired, program built and compiled,
  the tf.data streams, TensorBoard events, checkpoints, the learning curve), and one on a sweep's
  dev splits with few-shot evaluation, read the dataset from its arrays: nothing is prepared or
  written in data_dir."""
  log = tmp_path / 'w' / 'metrics.jsonl'
  log.parent.mkdir()
  log.write_text('{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2, "spl')  # a torn line
  code = f'''
from vit_jax.configs import mnist5k
from vit_jax.train import loop, program
from vit_jax.run import logs, workdir
config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4,batch_size=8')
config.warmup_steps = 1
config.data_dir = {str(tmp_path / 'tfds')!r}
workdir.prepare({str(tmp_path / 'w')!r})
logs.repair_log({str(log)!r}, 0)
prog = program.build_program(config)
print('classes', prog.num_classes, 'train', prog.num_train, 'steps', prog.total_steps)
print('log repaired:', open({str(log)!r}).read() == '')
result = loop.train_and_evaluate(config, {str(tmp_path / 'w')!r})
print('count', int(result['count']))
# A sweep's dev run: split expressions (the examples tfds would read), and few-shot evaluation.
config.train_split, config.eval_split = 'train[:90%]', 'train[90%:]'
config.evals.fewshot.every, config.evals.fewshot.shots = 4, (1, 2)
prog = program.build_program(config)
result = loop.train_and_evaluate(config, {str(tmp_path / 'dev')!r})
print('train', prog.num_train, 'count', int(result['count']), 'fewshot', sorted(
    k for k in logs.read_metrics({str(tmp_path / 'dev' / 'metrics.jsonl')!r})[-1]
    if k.endswith('shot')))
'''
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      'classes 10 train 4000 steps 4', 'log repaired: True',
      'count 1000', "train 3600 count 400 fewshot ['1shot', '2shot']"]
  assert not (tmp_path / 'tfds').exists()
  records = [json.loads(line) for line in log.read_text().splitlines()]
  assert [(r['step'], r['split']) for r in records] == [(4, 'train'), (4, 'eval')]
  events = os.listdir(tmp_path / 'w' / 'tensorboard')
  assert len(events) == 1 and events[0].startswith('events.out.tfevents.')
  assert os.path.getsize(tmp_path / 'w' / 'learning_curve.png') > 1000
