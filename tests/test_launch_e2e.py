"""`launch` end to end against a stand-in gcloud (tests/fake_gcloud.py): each worker of a 2-worker
"TPU VM" is a local directory. Only the tracked source reaches the workers, a second sync replaces
the code (no nesting, runs/ kept), setup installs the two pinned locks, the same command starts on
both workers and they form one 2-process JAX run on 127.0.0.1 through `vit_jax.main` (gloo CPU
collectives), --status and --logs show it, --stop ends it on both; a worker that never starts
makes the launcher fail and the other worker exit with one `error:` line.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from vit_jax.tools.launch import remote, source
from helpers import ROOT, free_port, xla_flags

pytestmark = pytest.mark.slow

TRAIN = ['python3', '-m', 'vit_jax.main',
         '--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps=100000,batch_size=32,lr=0.01',
         '--config.warmup_steps=1', '--config.log_every=1', '--config.eval_every=100000',
         '--config.checkpoint_every=100000', '--config.progress=False']


@pytest.fixture
def tpu(tmp_path):
  """(run launch with these args -> CompletedProcess, the workers' root directory)."""
  bin_dir, root = tmp_path / 'bin', tmp_path / 'tpu'
  bin_dir.mkdir()
  root.mkdir()
  (bin_dir / 'gcloud').write_text(
      f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
      f'{shlex.quote(os.path.join(ROOT, "tests", "fake_gcloud.py"))} "$@"\n')
  # The workers' python3: this interpreter. Its `pip install --target DIR` (of uv) is recorded
  # and leaves DIR/bin/uv, a stand-in that records its calls (no network): so setup's venv is not
  # made and the command's python3 stays this one (tests/test_launch.py runs the real setup).
  (bin_dir / 'python3').write_text(
      '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
      '  echo "$PWD python3 $*" >> "$FAKE_TPU_ROOT/pip.log"\n'
      '  while [ $# -gt 1 ]; do if [ "$1" = --target ]; then t=$2; fi; shift; done\n'
      '  mkdir -p "$t/bin"\n'
      '  printf \'#!/bin/sh\\n[ "$1" = --version ] && exit 0\\n'
      'for f in requirements.lock requirements-tpu.lock; do [ -f "$f" ] || exit 7; done\\n'
      'echo "$PWD uv $*" >> "$FAKE_TPU_ROOT/pip.log"\\n\' > "$t/bin/uv"\n'
      '  chmod +x "$t/bin/uv"; exit 0\nfi\n'
      f'exec {shlex.quote(sys.executable)} "$@"\n')
  for f in ('gcloud', 'python3'):
    os.chmod(bin_dir / f, 0o755)
  env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', FAKE_TPU_ROOT=str(root),
             FAKE_TPU_WORKERS='2', FAKE_TPU_COORDINATOR=f'127.0.0.1:{free_port()}',
             XLA_FLAGS=xla_flags(2))

  def launch(*args, down=''):
    return subprocess.run(
        [sys.executable, '-m', 'vit_jax', 'launch', '--tpu=fake-v4-16', '--zone=z',
         '--stop_timeout=120', *args], cwd=ROOT, env=dict(env, FAKE_TPU_DOWN=down),
        capture_output=True, text=True, timeout=300)
  yield launch, root
  launch('--stop')  # whatever the test's outcome: no run is left behind


def _files(top):
  return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)


def _wait_for(what, predicate, timeout_s=240):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(1)
  raise AssertionError(f'timed out waiting for {what}')


def _status(launch):
  proc = launch('--status', '--lines=3')
  assert proc.returncode == 0, proc.stderr
  return [l for l in proc.stdout.splitlines() if l.startswith('worker ')]


def test_sync_setup_run_status_stop_on_two_workers(tpu, tmp_path, data_dir):
  launch, root = tpu
  proc = launch('--sync', '--setup')
  assert proc.returncode == 0, proc.stderr
  tracked = source.tracked_files(ROOT)
  for w in ('worker0', 'worker1'):
    assert _files(root / w / 'vit_jax') == tracked  # the source, nothing else (.git, .venv, runs)
  pip = (root / 'pip.log').read_text().splitlines()
  pin = remote.uv_pin()
  expected = []
  for w in ('worker0', 'worker1'):  # uv into the launch directory, then the venv and both locks
    code, launch_dir = root / w / 'vit_jax', root / w / 'vit_jax_launch'
    install = f'{code} uv pip install --quiet --python {launch_dir}/venv/bin/python --no-deps'
    expected += [
        f'{code} python3 -m pip install --quiet --no-deps --upgrade --target {launch_dir}/uv {pin}',
        f'{code} uv venv --quiet --allow-existing --python 3.11 {launch_dir}/venv',
        f'{install} -r requirements.lock', f'{install} --require-hashes -r requirements-tpu.lock']
  assert sorted(pip) == sorted(expected)

  # A second sync replaces the code (a stale file goes, nothing nests) and keeps runs/.
  (root / 'worker0' / 'vit_jax' / 'stale.py').write_text('old')
  (root / 'worker0' / 'vit_jax' / 'runs').mkdir()
  (root / 'worker0' / 'vit_jax' / 'runs' / 'notes.txt').write_text('keep me')
  assert launch('--sync').returncode == 0
  assert _files(root / 'worker0' / 'vit_jax') == sorted(tracked + ['runs/notes.txt'])
  # No archive, no .new/.old left (the launch directory holds setup's uv).
  assert sorted(os.listdir(root / 'worker0')) == ['vit_jax', 'vit_jax_launch']

  # The same command on both workers: one 2-process run (4 devices) writing one workdir.
  workdir = tmp_path / 'shared_run'  # as a gs:// workdir: one place both workers see
  proc = launch('--', *TRAIN, f'--workdir={workdir}', f'--config.data_dir={data_dir}')
  assert proc.returncode == 0, proc.stderr
  metrics = workdir / 'metrics.jsonl'
  _wait_for('3 logged steps', lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
  status = _status(launch)
  assert [s.split(' (pid')[0] for s in status] == ['worker 0: running', 'worker 1: running']
  logs = launch('--logs', '--lines=1000').stdout
  assert 'for 100000 steps on 2 processes x 2 x cpu' in logs, logs
  assert '== worker 1: ~/vit_jax_launch/log.txt' in logs, logs
  # A second start while it runs is refused, and the run is left alone.
  again = launch('--', *TRAIN, f'--workdir={workdir}')
  assert again.returncode == 2 and 'a launched run is still alive' in again.stderr

  proc = launch('--stop')
  assert proc.returncode == 0, proc.stderr
  assert [l.split(' (pid')[0] for l in proc.stdout.splitlines() if not l.startswith('gcloud')] \
      == ['stopped', 'stopped']
  status = _status(launch)
  assert all(': not running (pid' in s for s in status) and len(status) == 2, status
  steps = [json.loads(l)['step'] for l in metrics.read_text().splitlines()]
  assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3
  # SIGTERM on both: the run saved its last step, as a preempted TPU run does.
  log = (root / 'worker0' / 'vit_jax_launch' / 'log.txt').read_text()
  assert f'preempted: saved the checkpoint of step {steps[-1]}' in log, log
  assert os.listdir(workdir / 'checkpoints') == [str(steps[-1])]


def test_a_worker_that_never_starts_stops_the_other_with_one_line(tpu, data_dir, tmp_path):
  launch, root = tpu
  assert launch('--sync').returncode == 0
  proc = launch('--', *TRAIN, f'--workdir={tmp_path / "run"}', f'--config.data_dir={data_dir}',
                '--distributed_timeout=5', down='1')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith('error: gcloud compute tpus tpu-vm ssh')
  _wait_for('worker 0 to give up', lambda: 'not running' in _status(launch)[0], 120)
  log = (root / 'worker0' / 'vit_jax_launch' / 'log.txt').read_text()
  lines = [l for l in log.splitlines() if l.strip()]
  assert len(lines) == 1, log
  assert lines[0].startswith('error: the distributed runtime did not start within 5 s'), log
  assert not (root / 'worker1' / 'vit_jax_launch').exists()
