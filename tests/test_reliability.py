"""Faults: preemption, kill -9 (also mid-checkpoint), corrupt checkpoints, NaNs, config drift,
checkpoints that do not fit the run (refused before restoring, never set aside), Ctrl-C.

Every interrupted run must end with parameters bitwise equal to the uninterrupted reference run.
"""

import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from vit_jax.configs import mnist5k
from image_folder_util import write_colour_folder
from vit_jax.analysis import inputs
from vit_jax.checkpoint import train_ckpt
from vit_jax.errors import UserError
from vit_jax.run import guards
from vit_jax.run import logs
from vit_jax.train import loop
from vit_jax.train import program
from helpers import ROOT, free_port, xla_flags

# One worker runs this module, so its shared fixtures are computed once per test run.
pytestmark = pytest.mark.xdist_group('reliability')

STEPS = 24
ARGS = [f'--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps={STEPS},batch_size=16,lr=0.01',
        '--config.warmup_steps=2', '--config.log_every=1', f'--config.eval_every={STEPS}',
        '--config.progress=False', '--config.model.dropout_rate=0.1']


def _config(data_dir, **overrides):
  c = mnist5k.get_config(f'model_name=ViT-Ze/4,steps={STEPS},batch_size=16,lr=0.01')
  c.warmup_steps, c.log_every, c.eval_every, c.progress = 2, 1, STEPS, False
  c.model.dropout_rate, c.data_dir = 0.1, data_dir  # dropout: the step RNG must resume too
  for key, value in overrides.items():
    c[key] = value
  return c


def _final_state(workdir, step=STEPS):
  params, _ = inputs.load_checkpoint(f'{workdir}/checkpoints/{step}')
  return params


def _assert_bitwise_equal(a, b):
  flat_a, flat_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert np.array_equal(x, y), jax.tree_util.keystr(path)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, data_dir):
  """The uninterrupted run (8 devices, as the subprocesses below)."""
  workdir = tmp_path_factory.mktemp('reference')
  loop.train_and_evaluate(_config(data_dir), str(workdir))
  return workdir


def _launch(workdir, data_dir, *extra):
  return subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *ARGS, f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', *extra],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trained_steps(workdir) -> int:
  records = logs.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
  return max((r['step'] for r in records if r['split'] == 'train'), default=0)


def _wait_for_step(proc, workdir, step, timeout=300):
  deadline = time.monotonic() + timeout
  while _trained_steps(workdir) < step:
    assert proc.poll() is None, proc.communicate()[1]
    assert time.monotonic() < deadline
    time.sleep(0.02)


def test_sigterm_at_a_random_step_then_resume_is_bitwise_exact(tmp_path, data_dir, reference):
  workdir = tmp_path / 'work'
  stop_after = random.Random(os.getpid()).randint(3, STEPS - 6)
  proc = _launch(workdir, data_dir, '--config.checkpoint_every=1000')
  _wait_for_step(proc, workdir, stop_after)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  last = err.strip().splitlines()[-1]
  assert last.startswith('preempted: saved the checkpoint of step ') and last.endswith(
      'rerun the same command to resume'), err
  saved = int(last.split('step ')[1].split(' ')[0])
  assert stop_after <= saved < STEPS
  assert sorted(os.listdir(workdir / 'checkpoints')) == [str(saved)]
  # The rerun resumes there and ends exactly where the uninterrupted run ended.
  proc = _launch(workdir, data_dir, '--config.checkpoint_every=1000')
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0 and f'at step {saved}' in err, err
  _assert_bitwise_equal(_final_state(workdir), _final_state(reference))
  steps = [r['step'] for r in logs.read_metrics(str(workdir / 'metrics.jsonl'))
           if r['split'] == 'train']
  assert steps == list(range(1, STEPS + 1))  # each step logged once


def test_kill_9_loop_always_resumes_and_ends_bitwise_exact(tmp_path, data_dir, reference):
  """6 kills: odd ones the moment a checkpoint is being written, even ones at random times."""
  workdir = tmp_path / 'work'
  extra = ['--config.checkpoint_every=1', '--config.keep_checkpoints=2']
  rng = random.Random(1234)
  mid_write = 0
  for kill in range(6):
    proc = _launch(workdir, data_dir, *extra)
    _wait_for_step(proc, workdir, min(_trained_steps(workdir) + 1, STEPS - 1))
    if kill % 2:  # wait for an unfinished checkpoint directory, then kill at once
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline and proc.poll() is None:
        entries = os.listdir(workdir / 'checkpoints')
        if any('tmp' in e for e in entries):
          mid_write += 1
          break
        time.sleep(0.001)
    else:
      time.sleep(rng.uniform(0, 0.3))
    proc.kill()
    proc.communicate()
    assert _trained_steps(workdir) < STEPS, 'the run finished before the kills did'
  assert mid_write >= 2, mid_write
  proc = _launch(workdir, data_dir, *extra)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  _assert_bitwise_equal(_final_state(workdir), _final_state(reference))


def test_corrupt_latest_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path, data_dir, reference, capfd):
  workdir = tmp_path / 'work'
  loop.train_and_evaluate(_config(data_dir, checkpoint_every=10), str(workdir))
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['10', '20', str(STEPS)]
  for root, _, files in os.walk(workdir / 'checkpoints' / str(STEPS) / 'state'):
    for name in files:  # damage every data file of the newest step
      with open(os.path.join(root, name), 'r+b') as f:
        f.truncate(max(0, os.path.getsize(os.path.join(root, name)) // 3))
  capfd.readouterr()
  loop.train_and_evaluate(_config(data_dir, checkpoint_every=10), str(workdir))
  err = capfd.readouterr().err
  assert f'checkpoint {STEPS} in' in err and 'is damaged (' in err, err
  assert 'at step 20' in err, err
  assert os.listdir(workdir / 'corrupt_checkpoints')[0].startswith(f'{STEPS}-')  # kept
  _assert_bitwise_equal(_final_state(workdir), _final_state(reference))


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  loop.train_and_evaluate(_config(data_dir, total_steps=4), str(workdir))
  with pytest.raises(guards.Diverged, match=r'non-finite .*nan.* at step (\d+); the last '
                                            r'checkpoint \(step \d+\) is intact') as error:
    loop.train_and_evaluate(_config(data_dir, total_steps=12, lr=1e30, checkpoint_every=1),
                            str(workdir), allow_config_change=True)
  bad_step = int(str(error.value).split(' at step ')[1].split(';')[0])
  saved = sorted(int(s) for s in os.listdir(workdir / 'checkpoints'))
  assert 4 in saved and max(saved) < bad_step, (saved, bad_step)  # nothing from a bad step on
  assert f'(step {max(saved)}) is intact' in str(error.value)
  # Skipping mode: bad steps are counted in the log and the run stops after the limit.
  with pytest.raises(guards.Diverged, match='after skipping 2 such steps'):
    loop.train_and_evaluate(_config(data_dir, total_steps=12, lr=1e30, max_nonfinite_steps=2),
                            str(tmp_path / 'skip'))
  records = logs.read_metrics(str(tmp_path / 'skip' / 'metrics.jsonl'))
  assert [r['skipped'] for r in records][-2:] == [1.0, 2.0]


def test_config_drift_is_refused_unless_allowed(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  loop.train_and_evaluate(_config(data_dir, total_steps=3), str(workdir))
  with pytest.raises(UserError, match=r"with another config: lr 0.01 -> 0.02, total_steps 3 -> "
                                      r"4; rerun with the same config, use a new --workdir, or "
                                      r"pass --allow_config_change"):
    loop.train_and_evaluate(_config(data_dir, total_steps=4, lr=0.02), str(workdir))
  # Operational keys (logging, checkpoint cadence, devices) may change freely.
  result = loop.train_and_evaluate(_config(data_dir, total_steps=3, log_every=2,
                                           checkpoint_every=7), str(workdir))
  assert result['count'] == 1000
  result = loop.train_and_evaluate(_config(data_dir, total_steps=4, lr=0.02), str(workdir),
                                   allow_config_change=True)
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['3', '4']


def test_a_resumed_run_compiles_its_train_step_while_the_checkpoint_is_read(
    tmp_path, data_dir, reference, monkeypatch):
  """Once a checkpoint's config and shapes are accepted, the train step compiles on another
  thread while its arrays are read; a finished run, which trains no step, compiles nothing."""
  workdir = tmp_path / 'work'
  shutil.copytree(reference, workdir)
  events = []
  compile_step = program.Program.compile_train_step_in_background
  restore = train_ckpt.Checkpointer.restore
  monkeypatch.setattr(program.Program, 'compile_train_step_in_background',
                      lambda self: events.append('compile') or compile_step(self))
  monkeypatch.setattr(train_ckpt.Checkpointer, 'restore',
                      lambda self, *args: events.append('restore') or restore(self, *args))
  loop.train_and_evaluate(_config(data_dir), str(workdir))
  assert events == ['restore']
  events.clear()
  loop.train_and_evaluate(_config(data_dir, total_steps=STEPS + 2), str(workdir),
                          allow_config_change=True)
  assert events == ['compile', 'restore']
  assert _trained_steps(workdir) == STEPS + 2


def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  port = free_port()
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *ARGS, f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', '--config.checkpoint_every=1000',
       # Long enough that the stop (agreed through the coordination service a few steps after
       # the signal) comes well before the end: a step of this model takes milliseconds.
       '--config.total_steps=400', '--config.eval_every=400',
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  _wait_for_step(procs[0], workdir, 4)
  assert json.loads((workdir / 'run.lock').read_text())['pid'] == procs[0].pid  # one lock
  procs[1].send_signal(signal.SIGTERM)  # only the second process is told
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err
  saved = sorted(os.listdir(workdir / 'checkpoints'))
  assert len(saved) == 1 and 4 <= int(saved[0]) < 400, saved
  assert f'preempted: saved the checkpoint of step {saved[0]}' in outs[0][1]


def test_sigterm_while_a_two_process_run_resumes_stops_it_at_its_first_step(
    tmp_path, data_dir, reference):
  """A signal that comes before the first step of a resumed run (a scheduler's time-limit warning
  during start-up) stops it at that step: JAX's sync point counts calls from 0, not steps."""
  workdir = tmp_path / 'work'
  shutil.copytree(reference, workdir)  # step 24 of 24: resumed with more steps below
  port = free_port()
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *ARGS, f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', '--config.total_steps=400', '--config.eval_every=400',
       '--allow_config_change', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  said = []
  for line in procs[0].stderr:  # the runtime has started; the first step has not
    said.append(line)
    if line.startswith(f'resumed from {workdir}/checkpoints at step {STEPS}'):
      break
  for p in procs:
    p.send_signal(signal.SIGTERM)
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, ''.join(said) + err
  assert f'preempted: saved the checkpoint of step {STEPS + 1}' in outs[0][1], outs[0][1]
  assert sorted(os.listdir(workdir / 'checkpoints'), key=int) == [str(STEPS), str(STEPS + 1)]


# ---------------------------------------------------------------------------------------------
# Only an unreadable checkpoint is set aside: a run whose arrays would not fit is refused first.


def _tree(directory) -> dict:
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out


@pytest.fixture(scope='module')
def two_step_run(tmp_path_factory, data_dir):
  workdir = tmp_path_factory.mktemp('two_steps') / 'work'
  loop.train_and_evaluate(_config(data_dir, total_steps=2, checkpoint_every=1, eval_every=2,
                                  warmup_steps=1), str(workdir))
  return workdir


@pytest.mark.parametrize('overrides, allow, message', [
    (dict(model_name='ViT-Mu/4'), False,
     r"with another config: model_name 'ViT-Ze/4' -> 'ViT-Mu/4'; its arrays have other shapes "
     r"\(params/Transformer/encoder_norm/bias \(32,\) -> \(64,\), .*\), so it cannot go on with "
     r"this config: rerun with the same config, or use a new --workdir \(config.init=.* starts a "
     r"new run from its weights where they fit\)$"),
    (dict(num_classes=12), False,
     r'with another config: num_classes None -> 12; its arrays have other shapes \(params/head/'
     r'bias \(10,\) -> \(12,\), params/head/kernel \(32, 10\) -> \(32, 12\), '),
    (dict(model_name='ViT-Mu/4'), True,
     r"^--allow_config_change cannot continue .* \(step 2\) with model_name 'ViT-Ze/4' -> "
     r"'ViT-Mu/4': its arrays have other shapes .*; rerun with the stored values of the keys that "
     r'change them, or use a new --workdir'),
    (dict(image_size=32), True, r'params/Transformer/posembed_input/pos_embedding '
                                r'\(1, 50, 32\) -> \(1, 65, 32\)'),
], ids=['another_model', 'another_class_count', 'allow_config_change_another_model',
        'allow_config_change_another_image_size'])
def test_resume_with_other_shapes_is_refused_and_nothing_moved(
    tmp_path, data_dir, two_step_run, overrides, allow, message):
  workdir = tmp_path / 'work'
  shutil.copytree(two_step_run, workdir)
  before = _tree(workdir)
  config = _config(data_dir, total_steps=2, checkpoint_every=1, eval_every=2, warmup_steps=1,
                   **overrides)
  with pytest.raises(UserError, match=message):
    loop.train_and_evaluate(config, str(workdir), allow_config_change=allow)
  assert _tree(workdir) == before  # every checkpoint where it was, nothing set aside


def test_resume_after_a_class_folder_was_added_is_refused_and_nothing_moved(tmp_path):
  root = tmp_path / 'colours'
  write_colour_folder(str(root), per_class=4)
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=2,batch_size=8')
  c.dataset, c.data_dir, c.image_size = f'folder:{root}', str(tmp_path / 'tfds'), 16
  c.pp.train = c.pp.eval = 'resize'
  c.eval_batch_size, c.warmup_steps, c.progress = 8, 1, False
  workdir = tmp_path / 'work'
  loop.train_and_evaluate(c, str(workdir))
  before = _tree(workdir)
  shutil.copytree(root / 'blue', root / 'cyan')  # a fourth class: the folder is prepared again
  with pytest.raises(UserError, match=r'holds a run \(step 2\) of this config on other data '
                                      r"\(folder:.*colours: num_classes 3 -> 4\), so its arrays "
                                      r'have other shapes \(params/head/bias \(3,\) -> \(4,\), '
                                      r'.*: restore the dataset as it was to resume, or use a new '
                                      r'--workdir'):
    loop.train_and_evaluate(c, str(workdir))
  assert _tree(workdir) == before
  shutil.rmtree(root / 'cyan')  # as it was: the run resumes (and finds nothing left to train)
  assert loop.train_and_evaluate(c, str(workdir))['count'] == 3


def test_another_attention_kernel_is_not_config_drift(tmp_path, data_dir, two_step_run):
  """`model.attention` picks a kernel for the same parameters and math: a run resumes with
  another one without --allow_config_change."""
  workdir = tmp_path / 'work'
  shutil.copytree(two_step_run, workdir)
  config = _config(data_dir, total_steps=2, checkpoint_every=1, eval_every=2, warmup_steps=1)
  config.model.attention = 'dot_product'
  assert loop.train_and_evaluate(config, str(workdir))['count'] == 1000  # the final step, resumed
  assert not os.path.exists(workdir / 'corrupt_checkpoints')


def test_a_changed_config_that_keeps_shapes_resumes_with_allow_config_change(
    tmp_path, data_dir, two_step_run):
  workdir = tmp_path / 'work'
  shutil.copytree(two_step_run, workdir)
  config = _config(data_dir, total_steps=3, checkpoint_every=1, eval_every=3, lr=0.02,
                   warmup_steps=1)
  loop.train_and_evaluate(config, str(workdir), allow_config_change=True)
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['1', '2', '3']  # resumed at 2
  assert not os.path.exists(workdir / 'corrupt_checkpoints')
  steps = [r['step'] for r in logs.read_metrics(str(workdir / 'metrics.jsonl'))
           if r['split'] == 'train']
  assert steps == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Ctrl-C: a second one while a checkpoint is written waits for it; one during start-up is a line.


def test_second_ctrl_c_while_a_checkpoint_is_written_waits_for_it(capfd):
  preemption = guards.Preemption()
  with pytest.raises(KeyboardInterrupt):  # still starting: stops at once, nothing trained
    preemption._handle(signal.SIGINT, None)
  preemption = guards.Preemption()
  preemption.begin_training()
  preemption._handle(signal.SIGINT, None)  # the first: stop at the next step boundary
  assert preemption.requested
  with preemption.saving():
    preemption._handle(signal.SIGINT, None)  # the second, while saving: not an interrupt
  assert 'still writing a checkpoint: the run stops once it is complete' in capfd.readouterr().err
  with pytest.raises(KeyboardInterrupt):  # outside a save it stops at once
    preemption._handle(signal.SIGINT, None)


def test_second_ctrl_c_soon_after_the_first_keeps_a_complete_checkpoint(tmp_path, data_dir):
  """The second Ctrl-C comes 0.3 s after the first: the run either finishes the checkpoint it is
  writing (exit 0) or stops with one line naming the complete checkpoint that stands (exit 2);
  never a traceback, and the checkpoint it names restores."""
  workdir = tmp_path / 'work'
  proc = _launch(workdir, data_dir, '--config.checkpoint_every=5', '--config.total_steps=2000',
                 '--config.eval_every=2000')
  _wait_for_step(proc, workdir, 7)
  proc.send_signal(signal.SIGINT)
  time.sleep(0.3)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert 'Traceback' not in err, err
  lines = err.strip().splitlines()
  last = lines[-1]
  if last == 'error: interrupted (Ctrl-C): rerun the same command':  # it came as the run ended
    last = lines[-2]
  if last.startswith('preempted: saved the checkpoint of step '):
    assert proc.returncode in (0, 2), err
    step = int(last.split('step ')[1].split(' ')[0])
  else:
    assert proc.returncode == 2, err
    match = re.fullmatch(r'error: interrupted \(Ctrl-C\); the checkpoint of step (\d+) in (.*) '
                         r'stands: rerun the same command to resume from it', last)
    assert match and match.group(2) == str(workdir / 'checkpoints'), err
    step = int(match.group(1))
  assert step >= 5 and str(step) in os.listdir(workdir / 'checkpoints')
  assert _final_state(workdir, step)  # complete: it restores
  assert not os.path.exists(workdir / 'run.lock')


def _wait_for_start_up(pid: int, timeout: float = 120.0) -> None:
  """Until the process is in the command's start-up: it has loaded jaxlib. (A SIGINT while the
  interpreter itself starts, before `site` is imported, is Python's own fatal error, as for any
  program; the heuristic of a fixed sleep hit that window on a loaded machine.)"""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(f'/proc/{pid}/maps') as f:
      if 'jaxlib' in f.read():
        return
    time.sleep(0.01)
  raise AssertionError(f'process {pid} never loaded jaxlib')


def test_ctrl_c_during_start_up_is_one_line(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('keep me')
  proc = subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *ARGS, f'--workdir={workdir}',
       f'--config.data_dir={data_dir}'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=dict(os.environ, VIT_JAX_HUGEPAGES='0'))  # no restart: one interpreter
  _wait_for_start_up(proc.pid)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 2 and 'Traceback' not in err, err
  assert err.strip().splitlines() in (  # in the imports, or in the trainer's start-up
      ['error: interrupted (Ctrl-C): rerun the same command'],
      ['error: interrupted (Ctrl-C) while starting: nothing was written; rerun the same command'],
  ), err
  assert sorted(os.listdir(workdir)) == ['notes.txt']


_STARTING = ['error: interrupted (Ctrl-C): rerun the same command',
             'error: interrupted (Ctrl-C) while starting: nothing was written; rerun the same '
             'command',
             'error: interrupted (Ctrl-C); no checkpoint was written: rerun the same command']


def _interpreter_start_up(err: str) -> bool:
  """Python's own report of a Ctrl-C before it ran the command's first line (while `site` or
  runpy imports): the command's code is in none of its frames."""
  frames = [l for l in err.splitlines() if l.lstrip().startswith('File "')]
  return (err.rstrip().endswith('KeyboardInterrupt') and bool(frames)
          and not any(os.path.join(ROOT, 'vit_jax') in f for f in frames))


def test_ctrl_c_at_random_start_up_moments_always_stops_the_command(tmp_path, data_dir):
  """Real SIGINTs at random moments of the first two seconds (the huge-page restart included: huge
  pages left on), four commands at a time: each stops with one line and exit 2, or dies of the
  signal before Python installed its handler; it never trains, never leaves a workdir."""
  rng = random.Random(os.getpid())
  env = {k: v for k, v in os.environ.items() if k != 'VIT_JAX_HUGEPAGES'}

  def one(i):
    workdir = tmp_path / f'work{i}'
    proc = subprocess.Popen(
        [sys.executable, '-m', 'vit_jax.main', *ARGS, f'--workdir={workdir}',
         f'--config.data_dir={data_dir}'], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    time.sleep(rng.uniform(0, 2.0))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, workdir.exists()

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    outcomes = list(pool.map(one, range(16)))
  lines = 0
  for returncode, err, left in outcomes:
    assert not left, err
    if returncode in (1, -signal.SIGINT) and _interpreter_start_up(err):
      pass
    elif returncode == -signal.SIGINT:  # before the interpreter's handler: nothing printed
      assert err == ''
    else:
      assert returncode == 2 and err.strip().splitlines() in [[l] for l in _STARTING], err
      lines += 1
  assert lines >= 6, outcomes  # (the rest in Python's own start-up, slow on a loaded machine)
