"""The Cloud TPU launcher builds exact gcloud commands (tested with --dry_run; no gcloud here)."""

import shlex
import subprocess
import sys

import pytest

from vit_jax.commands import launch
from vit_jax.errors import UserError
from helpers import ROOT

TRAIN = ['python3', '-m', 'vit_jax.main', '--config=configs/default.py:steps=5',
         '--workdir=gs://bucket/run one']


def test_one_ssh_on_every_worker_runs_the_command_verbatim():
  (ssh,) = launch.build_commands(tpu='my-v3-32', zone='europe-west4-a', command=TRAIN,
                                 project='proj')
  assert ssh[:8] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-v3-32',
                     '--zone=europe-west4-a', '--project=proj']
  assert ssh[8] == '--worker=all'
  remote = ssh[9]
  assert remote.startswith('--command=cd ~/vit_jax && ')
  # What the worker's shell will run is exactly the argument list given.
  assert shlex.split(remote[len('--command=cd ~/vit_jax && '):]) == TRAIN


def test_sync_setup_and_detached_log():
  scp, setup, ssh = launch.build_commands(tpu='t', zone='z', command=TRAIN, sync=True,
                                          setup=True, log='logs/train 1.log',
                                          repo_dir='~/code dir', local_dir='/src')
  assert scp == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', '--recurse', '/src',
                 't:~/code dir', '--zone=z', '--worker=all']
  assert setup[-1] == "--command=cd ~/'code dir' && python3 -m pip install --quiet -e '.[tpu]'"
  words = shlex.split(ssh[-1][len('--command='):])
  assert words[:4] == ['cd', '~/code dir', '&&', 'nohup']
  assert words[4:4 + len(TRAIN)] == TRAIN
  assert words[4 + len(TRAIN):] == ['>', 'logs/train 1.log', '2>&1', '<', '/dev/null', '&']


@pytest.mark.parametrize('kwargs, needle', [
    (dict(tpu='', zone='z', command=TRAIN), 'pass --tpu=NAME and --zone=ZONE'),
    (dict(tpu='t', zone='z', command=[]), 'no command to run: put it after --'),
])
def test_bad_launch_arguments(kwargs, needle):
  with pytest.raises(UserError, match=needle):
    launch.build_commands(**kwargs)


def test_dry_run_cli_prints_the_commands_and_runs_nothing():
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'launch', '--tpu=my-v3-8', '--zone=us-central1-a',
       '--dry_run', '--', *TRAIN], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  (line,) = proc.stdout.strip().splitlines()
  words = shlex.split(line)
  assert words[:9] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-v3-8',
                       '--zone=us-central1-a', '--worker=all',
                       '--command=cd ~/vit_jax && ' + shlex.join(TRAIN)]
