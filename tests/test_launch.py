"""The Cloud TPU launcher's gcloud commands and worker scripts (pure; tests/test_launch_e2e.py
runs them against a stand-in gcloud)."""

import base64
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

from vit_jax.errors import UserError
from vit_jax.tools.launch import remote, source
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
  plan = remote.Plan('t', 'z', repo_dir='~/code dir', launch_dir='/var/launch here',
                     uv='uv==0.13.9')
  script = plan.setup()[-1]
  assert script.startswith("--command=set -e; cd ~/'code dir'; if [ \"$('/var/launch here/uv/bin/uv'"
                           " --version 2>/dev/null | cut -d\" \" -f2)\" != 0.13.9 ]; then python3 -m "
                           "pip install --quiet --no-deps --upgrade --target '/var/launch here/uv' "
                           "uv==0.13.9 || {")
  assert script.endswith(
      "'/var/launch here/uv/bin/uv' venv --quiet --allow-existing --python 3.11 "
      "'/var/launch here/venv'; '/var/launch here/uv/bin/uv' pip install --quiet --python "
      "'/var/launch here/venv/bin/python' --no-deps -r requirements.lock; "
      "'/var/launch here/uv/bin/uv' pip install --quiet --python '/var/launch here/venv/bin/python'"
      " --no-deps --require-hashes -r requirements-tpu.lock")
  start = plan.start(TRAIN)[-1]
  assert "'/var/launch here/log.txt'" in start
  assert """export PATH='/var/launch here/venv/bin':"$PATH"; cd ~/'code dir' && """ in start
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


def _wheel(directory, name: str) -> str:
  """A pure-Python wheel `name` 1.0 (one module whose NAME is its name); returns its path."""
  files = {f'{name}/__init__.py': f'NAME = {name!r}\n',
           f'{name}-1.0.dist-info/METADATA': f'Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n',
           f'{name}-1.0.dist-info/WHEEL': ('Wheel-Version: 1.0\nGenerator: tests\n'
                                          'Root-Is-Purelib: true\nTag: py3-none-any\n')}
  def digest(text):
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip('=')
  record = ''.join(f'{path},sha256={digest(text)},{len(text.encode())}\n'
                   for path, text in files.items())
  files[f'{name}-1.0.dist-info/RECORD'] = record + f'{name}-1.0.dist-info/RECORD,,\n'
  path = os.path.join(directory, f'{name}-1.0-py3-none-any.whl')
  with zipfile.ZipFile(path, 'w') as z:
    for member, text in files.items():
      z.writestr(member, text)
  return path


@pytest.mark.slow
def test_setup_makes_a_python_3_11_venv_from_an_older_python_and_start_uses_it(tmp_path):
  """The worker-side scripts, run here: a python3.10 whose pip only fetches uv (a stand-in that
  links this venv's uv, the pinned one), uv makes the 3.11 venv and installs both locks (two
  hand-made wheels from a local directory, no index, no downloads), a second setup reuses uv, and
  the started command's python3 is the venv's."""
  uv_real = os.path.join(os.path.dirname(sys.executable), 'uv')
  pin = remote.uv_pin()
  assert subprocess.run([uv_real, '--version'], capture_output=True, text=True).stdout.split()[1] \
      == pin.split('==')[1]
  repo, launch, wheels = tmp_path / 'code dir', tmp_path / 'launch here', tmp_path / 'wheels'
  for d in (repo, wheels):
    d.mkdir()
  _wheel(wheels, 'probe_cpu')
  with open(_wheel(wheels, 'probe_tpu'), 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  (repo / 'requirements.lock').write_text('probe_cpu==1.0\n')
  (repo / 'requirements-tpu.lock').write_text(f'probe_tpu==1.0 --hash=sha256:{digest}\n')
  pip_log = tmp_path / 'pip.log'
  old_python = tmp_path / 'python3.10'
  old_python.write_text(
      '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> ' + shlex.quote(str(pip_log))
      + '\n  while [ $# -gt 1 ]; do if [ "$1" = --target ]; then t=$2; fi; shift; done\n'
      '  mkdir -p "$t/bin" && ln -sf ' + shlex.quote(uv_real) + ' "$t/bin/uv"; exit 0\nfi\nexit 1\n')
  old_python.chmod(0o755)
  plan = remote.Plan('t', 'z', repo_dir=str(repo), launch_dir=str(launch), python=str(old_python),
                     uv=pin)
  env = dict(os.environ, UV_NO_INDEX='1', UV_FIND_LINKS=str(wheels), UV_PYTHON_DOWNLOADS='never',
             UV_CACHE_DIR=str(tmp_path / 'uv-cache'))
  env.pop('VIRTUAL_ENV', None)
  for _ in range(2):
    proc = subprocess.run(['bash', '-c', plan.setup_script()], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
  # uv fetched once (the second setup found the pinned one), into the launch directory.
  assert pip_log.read_text().splitlines() == [
      f'-m pip install --quiet --no-deps --upgrade --target {launch}/uv {pin}']
  venv_python = str(launch / 'venv' / 'bin' / 'python')
  check = subprocess.run([venv_python, '-c', 'import sys, probe_cpu, probe_tpu; '
                          'print(*sys.version_info[:2], probe_cpu.NAME, probe_tpu.NAME)'],
                         capture_output=True, text=True)
  assert check.stdout.split() == ['3', '11', 'probe_cpu', 'probe_tpu'], check.stderr
  # The command's python3 is the venv's.
  start = plan.start_script(['python3', '-c', 'import sys, probe_tpu; print(sys.prefix)'])
  subprocess.run(['bash', '-c', start], check=True, env=env, timeout=60)
  log = launch / 'log.txt'
  for _ in range(200):
    if log.exists() and log.read_text().strip():
      break
    time.sleep(0.05)
  assert log.read_text().strip() == str(launch / 'venv')
  # A worker whose pip fails: one line, exit 4.
  no_pip = tmp_path / 'nopip'
  no_pip.write_text('#!/bin/sh\nexit 1\n')
  no_pip.chmod(0o755)
  shutil.rmtree(launch / 'uv')
  bad = remote.Plan('t', 'z', repo_dir=str(repo), launch_dir=str(launch), python=str(no_pip),
                    uv=pin)
  proc = subprocess.run(['bash', '-c', bad.setup_script()], capture_output=True, text=True, env=env)
  assert proc.returncode == 4
  assert proc.stderr.startswith(f'error: pip could not install {pin} on ') and \
      proc.stderr.count('\n') == 1, proc.stderr


def test_uv_pin_is_read_from_the_lock(tmp_path):
  assert remote.uv_pin().startswith('uv==')
  lock = tmp_path / 'requirements.lock'
  lock.write_text('absl-py==2.5.1\nuv==1.2.3  # comment\n')
  assert remote.uv_pin(str(lock)) == 'uv==1.2.3'
  lock.write_text('absl-py==2.5.1\n')
  with pytest.raises(UserError, match='pins no uv'):
    remote.uv_pin(str(lock))
  with pytest.raises(UserError, match='cannot read .*missing.lock'):
    remote.uv_pin(str(tmp_path / 'missing.lock'))


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
