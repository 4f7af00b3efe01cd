"""The Cloud TPU launcher's gcloud commands and worker scripts (pure; tests/test_launch_e2e.py
runs them against a stand-in gcloud)."""

import os
import shlex
import subprocess
import sys
import tarfile

import pytest

from vit_jax.errors import UserError
from vit_jax.launch import remote, source
from helpers import ROOT

TRAIN = ['python3', '-m', 'vit_jax.main', '--config=configs/default.py:steps=5',
         '--workdir=gs://bucket/run one']


def test_start_is_one_ssh_on_every_worker_running_the_command_verbatim_detached():
  plan = remote.Plan('my-v3-32', 'europe-west4-a', 'proj')
  ssh = plan.start(TRAIN)
  assert ssh[:9] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-v3-32',
                     '--zone=europe-west4-a', '--project=proj', '--worker=all']
  script = ssh[9][len('--command='):]
  assert f'setsid nohup {shlex.join(TRAIN)} > ~/vit_jax_launch/log.txt 2>&1 < /dev/null & ' \
         f'echo $! > ~/vit_jax_launch/pid' in script
  assert 'cd ~/vit_jax && ' in script


def test_quoting_of_directories_with_spaces():
  plan = remote.Plan('t', 'z', repo_dir='~/code dir', launch_dir='/var/launch here')
  script = plan.setup()[-1]
  assert script.startswith('--command=set -e; python3 -c "import sys; sys.exit(sys.version_info '
                           '< (3, 11))" || { echo "error: $(python3 --version 2>&1) on')
  assert script.endswith(
      "cd ~/'code dir'; python3 -m pip install --quiet --no-deps -r "
      "requirements.lock; python3 -m pip install --quiet --no-deps --require-hashes -r "
      "requirements-tpu.lock")
  assert "'/var/launch here/log.txt'" in plan.start(TRAIN)[-1]
  scp, unpack = plan.sync('/tmp/x/vit_jax_source.tar.gz')
  assert scp == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', '/tmp/x/vit_jax_source.tar.gz',
                 't:vit_jax_source.tar.gz', '--zone=z', '--worker=all']
  assert "mv ~/'code dir.new' ~/'code dir'" in unpack[-1]


@pytest.mark.parametrize('kwargs, needle', [
    (dict(tpu='', zone='z'), 'pass --tpu=NAME and --zone=ZONE'),
    (dict(tpu='t', zone='z', repo_dir='~'), 'would replace a whole directory tree'),
])
def test_bad_launch_arguments(kwargs, needle):
  with pytest.raises(UserError, match=needle):
    remote.Plan(**kwargs)


def test_setup_refuses_a_python_older_than_the_pins(tmp_path):
  fake = tmp_path / 'python3.10'
  fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo Python 3.10.12; exit 0; fi\n'
                  'exit 1\n')  # `-c "...version_info < (3, 11)..."` is true: exit status 1
  fake.chmod(0o755)
  script = remote.Plan('t', 'z', python=str(fake)).setup_script()
  proc = subprocess.run(['bash', '-c', script], capture_output=True, text=True, cwd=tmp_path)
  assert proc.returncode == 4
  assert proc.stderr.startswith('error: Python 3.10.12 on ') and proc.stderr.rstrip().endswith(
      'the pinned jax needs Python >= 3.11: install one and pass --python=python3.11')
  ok = remote.Plan('t', 'z', repo_dir=str(tmp_path / 'nowhere'), python=sys.executable)
  proc = subprocess.run(['bash', '-c', ok.setup_script()], capture_output=True, text=True)
  assert proc.returncode == 1 and 'nowhere' in proc.stderr  # past the check: cd fails


def test_no_command_and_no_workers():
  with pytest.raises(UserError, match='no command to run: put it after --'):
    remote.Plan('t', 'z').start([])
  with pytest.raises(UserError, match='lists no workers'):
    remote.worker_count('{"name": "t"}', 't')
  assert remote.worker_count('{"networkEndpoints": [{}, {}, {}, {}]}', 't') == 4


def test_the_archive_holds_the_tracked_files_only(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'pkg').mkdir(parents=True)
  (repo / 'pkg' / 'a.py').write_text('a = 1\n')
  (repo / 'README.md').write_text('hi\n')
  (repo / 'gone.py').write_text('')
  subprocess.run(['git', 'init', '-q', str(repo)], check=True)
  subprocess.run(['git', '-C', str(repo), 'add', '.'], check=True)
  (repo / 'gone.py').unlink()  # tracked, deleted locally: left out
  (repo / 'runs').mkdir()
  (repo / 'runs' / 'big.bin').write_text('x')  # untracked: left out
  (repo / '.venv').mkdir()
  path = source.write_archive(str(repo), str(tmp_path))
  with tarfile.open(path) as tar:
    assert sorted(tar.getnames()) == ['README.md', 'pkg/a.py']
  os.remove(path)  # from a subdirectory: still the whole checkout
  with tarfile.open(source.write_archive(str(repo / 'pkg'), str(tmp_path))) as tar:
    assert sorted(tar.getnames()) == ['README.md', 'pkg/a.py']
  plain = tmp_path / 'plain'
  plain.mkdir()
  with pytest.raises(UserError, match=f'and {plain} is not in one'):
    source.tracked_files(str(plain))


@pytest.mark.slow
def test_dry_run_cli_prints_the_commands_and_runs_nothing():
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'launch', '--tpu=my-v3-8', '--zone=us-central1-a',
       '--dry_run', '--stop', '--', *TRAIN], cwd=ROOT, capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 0, proc.stderr
  stop, start = (shlex.split(l) for l in proc.stdout.strip().splitlines())
  assert stop[:8] == start[:8] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-v3-8',
                                   '--zone=us-central1-a', '--worker=all']
  assert 'kill -TERM -- -"$p"' in stop[8] and shlex.join(TRAIN) in start[8]
