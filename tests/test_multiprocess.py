"""Several processes on 127.0.0.1 (gloo CPU collectives) through the real `vit_jax.main`.

One run of 1 process x 8 devices is the reference. 2 processes x 4 devices give the same losses
(global data sharding: the same global batches on any process count), write one metrics log and
one set of checkpoints, and resume the reference's 8-device checkpoint; a 1-device mesh resumes it
too. A process whose peers never arrive fails within --distributed_timeout with one line.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np

from vit_jax.configs import mnist5k
from vit_jax.train import loop
from helpers import ROOT, free_port, records, xla_flags

STEPS = 6
CONFIG = [f'--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps={STEPS},batch_size=32,lr=0.01',
          '--config.warmup_steps=1', '--config.log_every=1', f'--config.eval_every={STEPS}',
          '--config.checkpoint_every=3', '--config.data_sharding=global',
          '--config.progress=False']


def _launch(workdir, data_dir, devices: int, processes: int, *extra):
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices))
  args = [sys.executable, '-m', 'vit_jax.main', *CONFIG, f'--workdir={workdir}',
          f'--config.data_dir={data_dir}', *extra]
  if processes > 1:
    port = free_port()
    args += [f'--coordinator_address=127.0.0.1:{port}', f'--num_processes={processes}']
  return [subprocess.Popen(args + ([f'--process_id={i}'] if processes > 1 else []), cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


def _wait(procs):
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err
  return outs


def _losses(workdir):
  return {r['step']: r['loss'] for r in records(workdir) if r['split'] == 'train'}


def _copy_at_step_3(src, dst):
  """The workdir as it was after step 3: checkpoint 3 only, metrics up to step 3."""
  shutil.copytree(src, dst)
  shutil.rmtree(os.path.join(dst, 'checkpoints', str(STEPS)))
  kept = [r for r in records(src) if r['step'] <= 3]
  with open(os.path.join(dst, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in kept)


def test_two_processes_match_one_and_resume_its_checkpoint(tmp_path, data_dir):
  one, two = tmp_path / 'one_x8', tmp_path / 'two_x4'
  reference = _launch(one, data_dir, devices=8, processes=1)
  fresh = _launch(two, data_dir, devices=4, processes=2)
  (out_one, err_one), = _wait(reference)
  outs_two = _wait(fresh)
  assert 'on 8 x cpu' in err_one and 'on 2 processes x 4 x cpu' in outs_two[0][1]
  expected = _losses(one)
  assert sorted(expected) == list(range(1, STEPS + 1))
  assert max(expected.values()) - min(expected.values()) > 0.01  # the comparison means something

  # 2 x 4 from scratch: the same losses; one metrics log and one set of checkpoints.
  got = _losses(two)
  np.testing.assert_allclose([got[s] for s in expected], list(expected.values()), rtol=1e-5)
  assert [(r['step'], r['split']) for r in records(two)] == [
      (s, 'train') for s in range(1, STEPS + 1)] + [(STEPS, 'eval')]
  assert sorted(os.listdir(two / 'checkpoints')) == ['3', str(STEPS)]
  finals = [out.strip().splitlines()[-1] for out, _ in outs_two]
  assert finals[0] == finals[1] == out_one.strip().splitlines()[-1], (finals, out_one)
  assert finals[0].endswith('(1000 examples)')

  # The 8-device checkpoint of step 3 resumes on 2 processes x 4 devices ...
  resumed_two = tmp_path / 'resumed_two_x4'
  _copy_at_step_3(one, resumed_two)
  outs = _wait(_launch(resumed_two, data_dir, devices=4, processes=2))
  assert 'at step 3' in outs[0][1]
  got = _losses(resumed_two)
  np.testing.assert_allclose([got[s] for s in (4, 5, 6)], [expected[s] for s in (4, 5, 6)],
                             rtol=1e-5)

  # ... and on a single device (in this process: a mesh of 1 of its 8 devices).
  resumed_one = tmp_path / 'resumed_one_device'
  _copy_at_step_3(one, resumed_one)
  config = mnist5k.get_config(f'model_name=ViT-Ze/4,steps={STEPS},batch_size=32,lr=0.01')
  config.warmup_steps, config.log_every, config.eval_every = 1, 1, STEPS
  config.checkpoint_every, config.progress, config.data_dir = 3, False, data_dir
  config.data_sharding = 'global'  # as the reference run (the same config, or resuming refuses)
  loop.train_and_evaluate(config, str(resumed_one), devices=jax.devices()[:1])
  got = _losses(resumed_one)
  np.testing.assert_allclose([got[s] for s in (4, 5, 6)], [expected[s] for s in (4, 5, 6)],
                             rtol=1e-5)


def test_missing_processes_fail_within_the_timeout(tmp_path, data_dir):
  """Process 0 alone (its peer never starts) and process 1 alone (no coordinator) both stop."""
  port = free_port()
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  workdir = tmp_path / 'work'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('keep me')
  start = time.monotonic()
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *CONFIG, f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', f'--coordinator_address=127.0.0.1:{port + i}',
       '--num_processes=2', f'--process_id={i}', '--distributed_timeout=5'],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert time.monotonic() - start < 90
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith('error: the distributed runtime did not start within 5 s'), err
    assert 'start the same command on all 2 processes' in lines[0]
  assert sorted(os.listdir(workdir)) == ['notes.txt']


def test_processes_with_different_workdirs_are_refused_before_anything_is_written(tmp_path,
                                                                                  data_dir):
  """Two real processes of one run, each given its own --workdir (as `--workdir=w/run_$SLURM_PROCID`
  under srun does): both stop with the same line naming the difference, and neither workdir
  is created."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(2))
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *CONFIG, f'--workdir={tmp_path}/w/run_{i}',
       f'--config.data_dir={data_dir}', f'--coordinator_address=127.0.0.1:{port}',
       '--num_processes=2', f'--process_id={i}'], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  line = (f'error: the processes of this run disagree: --workdir is {tmp_path}/w/run_0 on process '
          f'0 but {tmp_path}/w/run_1 on process 1; start every process with the same command '
          'line (a per-process value such as $SLURM_PROCID in a flag splits the run)')
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 2 and err.strip().splitlines()[-1] == line, err
    assert 'Traceback' not in err, err
  assert not (tmp_path / 'w').exists()


def test_the_first_difference_between_processes_is_named():
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  config = mnist5k.get_config().to_dict()
  argv = ['--config=c.py', '--workdir=w', '--process_id=0']
  same = parallel.run_record('w', config, argv)
  assert same['argv'] == ['--config=c.py', '--workdir=w']
  other = dict(config, lr=0.5)
  assert parallel.mesh.first_difference([same, parallel.run_record('w', config, argv[:2] + [
      '--process_id=1'])]) is None
  assert parallel.mesh.first_difference(
      [same, same, parallel.run_record('w', other, argv)]).startswith(
          f'the processes of this run disagree: config.lr is {config["lr"]!r} on process 0 but '
          '0.5 on process 2; ')
  assert 'command-line argument 3 is nothing on process 0 but --allow_config_change on ' \
      'process 1;' in parallel.mesh.first_difference(
          [same, parallel.run_record('w', config, argv + ['--allow_config_change'])])
