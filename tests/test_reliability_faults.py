"""Faults from the machine and the terminal, made real: a restore under a real memory limit
(RLIMIT_AS), a checkpoint written to a full tmpfs, SIGHUP, closed output pipes; and the dataset
a run records with its checkpoints (class names, fingerprint) against changed data."""

import contextlib
import json
import os
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
from vit_jax.checkpoint import integrity
from vit_jax.errors import UserError
from vit_jax.serving import bundle as bundle_lib
from vit_jax.serving import inference
from vit_jax.run import logs
from vit_jax.train import loop
from helpers import ROOT, file_tree, xla_flags

pytestmark = pytest.mark.xdist_group('reliability')

STEPS = 12
ARGS = [f'--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps={STEPS},batch_size=16',
        '--config.warmup_steps=1', '--config.log_every=4', f'--config.eval_every={STEPS}',
        '--config.progress=False']


def _config(data_dir, **overrides):
  c = mnist5k.get_config(f'model_name=ViT-Ze/4,steps={STEPS},batch_size=16')
  c.warmup_steps, c.log_every, c.eval_every, c.progress = 1, 4, STEPS, False
  c.data_dir = data_dir
  for key, value in overrides.items():
    c[key] = value
  return c


def _command(workdir, data_dir, *extra, tool=None):
  head = [tool] if tool else ['-m', 'vit_jax.main']
  return [sys.executable, *head, *ARGS, f'--workdir={workdir}', f'--config.data_dir={data_dir}',
          *extra]


def _env(**extra):
  return dict(os.environ, VIT_JAX_HUGEPAGES='0', **extra)  # one interpreter: signals reach it


def _train_wide(workdir, data_dir) -> None:
  """A finished 2-step run whose head has 200,000 classes (25.6 MB on each of 8 devices once
  restored), trained in its own process on one device: the 8 simulated devices' collectives over
  this head can outwait XLA:CPU's rendezvous on 2 busy cores, which aborts the process."""
  proc = subprocess.run(
      _command(workdir, data_dir, '--config.total_steps=2', '--config.num_classes=200000',
               '--config.eval_batch_size=64', '--config.eval_every=2'),
      cwd=ROOT, env=_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _train_steps(workdir) -> list:
  return [r['step'] for r in logs.read_metrics(os.path.join(workdir, 'metrics.jsonl'))
          if r['split'] == 'train']


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory, data_dir):
  workdir = tmp_path_factory.mktemp('finished') / 'work'
  loop.train_and_evaluate(_config(data_dir, total_steps=4, checkpoint_every=2), str(workdir))
  return workdir


# ---------------------------------------------------------------------------------------------
# A checkpoint is set aside only when its own files fail the integrity check.


def test_each_checkpoint_has_a_manifest_that_its_files_match(finished_run):
  for step in ('2', '4'):
    step_dir = finished_run / 'checkpoints' / step
    manifest = json.loads((step_dir / integrity.MANIFEST).read_text())['files']
    assert any(name.startswith('state/') for name in manifest)
    assert integrity.damage(step_dir) is None


def test_a_flipped_byte_a_bad_commit_metadata_file_and_no_manifest_are_damage(
    tmp_path, finished_run):
  step_dir = tmp_path / '4'
  shutil.copytree(finished_run / 'checkpoints' / '4', step_dir)
  (step_dir / '_CHECKPOINT_METADATA').write_text('{"truncated')  # written by orbax's commit,
  assert integrity.damage(step_dir) == '_CHECKPOINT_METADATA is not valid JSON'  # after the
  shutil.copy(finished_run / 'checkpoints' / '4' / '_CHECKPOINT_METADATA', step_dir)  # manifest
  name = _flip_a_byte_of_the_largest_array_file(step_dir)
  assert integrity.damage(step_dir) == f'{name} does not match its checksum'
  (step_dir / integrity.MANIFEST).unlink()  # nothing to check the files against
  assert integrity.damage(step_dir) == integrity.UNVERIFIED
  assert integrity.damage(step_dir, large=False) == integrity.UNVERIFIED


def test_the_manifest_is_written_inside_orbax_commit(tmp_path):
  """The step directory gets its final name with its manifest in it: nothing of this project
  runs after orbax's own background commit has finished."""
  from vit_jax.checkpoint import train_ckpt  # pylint: disable=g-import-not-at-top
  checkpointer = train_ckpt.Checkpointer(str(tmp_path), keep=2)
  checkpointer.save(3, {'w': jax.numpy.arange(6.0)}, {'seed': 0})
  checkpointer._manager.wait_until_finished()  # pylint: disable=protected-access  # orbax's alone
  step_dir = tmp_path / 'checkpoints' / '3'
  assert (step_dir / integrity.MANIFEST).exists()
  assert integrity.damage(step_dir) is None
  checkpointer.close()
  assert sorted(p.name for p in step_dir.rglob(integrity.MANIFEST)) == [integrity.MANIFEST]


def _flip_a_byte_of_the_largest_array_file(step_dir) -> str:
  """Flips one byte in the middle of the step's largest array data file (its size unchanged);
  returns the file's path relative to the step directory."""
  files = json.loads((step_dir / integrity.MANIFEST).read_text())['files']
  name = max((n for n in files if '/d/' in n), key=lambda n: files[n][0])
  path = step_dir / name
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))
  return name


@pytest.mark.parametrize('when', ['before_reading', 'while_reading'])
def test_a_flipped_byte_sets_the_step_aside_at_restore_and_the_run_resumes_from_the_previous(
    tmp_path, data_dir, finished_run, capfd, monkeypatch, when):
  """One byte flipped in a step's array data (orbax reads it without complaint): the restore
  checks the step against its manifest, sets it aside and resumes from the previous step, which
  trains on to the same parameters as the intact run. The check runs before the arrays are read
  for files up to integrity.SMALL bytes (all of this tiny run's), beside the read above."""
  from vit_jax.checkpoint import restore, train_ckpt  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'work'
  shutil.copytree(finished_run, workdir)
  name = _flip_a_byte_of_the_largest_array_file(workdir / 'checkpoints' / '4')
  restored = []
  if when == 'while_reading':
    monkeypatch.setattr(integrity, 'SMALL', 0)  # every checksum on the verification thread
    original = train_ckpt.Checkpointer.restore
    monkeypatch.setattr(train_ckpt.Checkpointer, 'restore',
                        lambda self, step, *a: restored.append(step) or original(self, step, *a))
  capfd.readouterr()
  loop.train_and_evaluate(_config(data_dir, total_steps=4, checkpoint_every=2), str(workdir))
  err = capfd.readouterr().err
  assert restored == ([4, 2] if when == 'while_reading' else [])
  (aside,) = os.listdir(workdir / 'corrupt_checkpoints')
  # Where the flipped byte also breaks orbax's own read of the data (it depends on where the
  # byte lands in the stored chunks), the line adds what that read raised after the checksum.
  assert re.search(
      re.escape(f'checkpoint 4 in {workdir}/checkpoints is damaged ({name} does not match its '
                f'checksum') + r'(; [^\n]+)?' +
      re.escape(f'); moved it to {workdir}/corrupt_checkpoints/{aside} and trying the previous '
                'one'), err), err
  assert f'note: starting from step 2 while the newer checkpoint(s) 4 sit in' in err, err
  assert 'resumed from' in err and 'at step 2' in err, err
  assert _train_steps(workdir) == [4]  # step 4 trained again (logged every 4 steps)
  params, _ = restore.load_checkpoint(workdir / 'checkpoints' / '4')
  intact, _ = restore.load_checkpoint(finished_run / 'checkpoints' / '4')
  assert jax.tree.all(jax.tree.map(np.array_equal, params, intact))


def test_a_step_without_manifest_is_never_used_by_resume_predict_export_or_init(
    tmp_path, data_dir, finished_run, capfd):
  """Step 4 as a run killed between orbax's commit and a separate manifest write left it, with
  one byte of its array data flipped (orbax reads it without complaint): the resume sets it
  aside and trains on from step 2; predict/export and config.init read step 2 with a note, and
  refuse step 4 when it is named, with a hint their own command takes."""
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  from vit_jax.train import transfer  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'work'
  shutil.copytree(finished_run, workdir)
  step_dir = workdir / 'checkpoints' / '4'
  _flip_a_byte_of_the_largest_array_file(step_dir)
  (step_dir / integrity.MANIFEST).unlink()
  unverified = f'checkpoint {step_dir} cannot be verified ({integrity.UNVERIFIED})'
  capfd.readouterr()

  bundle = bundle_lib.from_workdir(str(workdir))  # predict and export read their model so
  assert bundle.source['checkpoint'] == str(workdir / 'checkpoints' / '2')
  assert capfd.readouterr().err == f'note: {unverified}; reading the newest healthy one\n'
  with pytest.raises(restore.Damaged, match=rf'^{re.escape(unverified)}: use another step '
                                            r'\(--checkpoint=STEP; '):
    bundle_lib.from_workdir(str(workdir), '4')

  pretrained = transfer.load_pretrained(str(workdir))
  assert pretrained.source == str(workdir / 'checkpoints' / '2')
  assert capfd.readouterr().err == f'note: {unverified}; reading the newest healthy one\n'
  with pytest.raises(restore.Damaged, match=rf'^{re.escape(unverified)}: use another step '
                                            rf'\(--config.init={re.escape(str(workdir))}'
                                            r'/checkpoints/STEP; '):
    transfer.load_pretrained(str(step_dir))
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['2', '4']  # readers move nothing

  loop.train_and_evaluate(_config(data_dir, total_steps=4, checkpoint_every=2), str(workdir))
  err = capfd.readouterr().err
  (aside,) = os.listdir(workdir / 'corrupt_checkpoints')
  assert (f'checkpoint 4 in {workdir}/checkpoints cannot be verified ({integrity.UNVERIFIED}); '
          f'moved it to {workdir}/corrupt_checkpoints/{aside} and trying the previous one'
          ) in err, err
  assert 'resumed from' in err and 'at step 2' in err, err
  params, _ = restore.load_checkpoint(workdir / 'checkpoints' / '4')
  intact, _ = restore.load_checkpoint(finished_run / 'checkpoints' / '4')
  assert jax.tree.all(jax.tree.map(np.array_equal, params, intact))


def test_predict_reads_the_newest_healthy_step_and_refuses_a_named_damaged_one(
    tmp_path, finished_run, capfd):
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'work'
  shutil.copytree(finished_run, workdir)
  name = _flip_a_byte_of_the_largest_array_file(workdir / 'checkpoints' / '4')
  before = file_tree(workdir)
  capfd.readouterr()
  bundle = bundle_lib.from_workdir(str(workdir))
  assert bundle.source['checkpoint'] == str(workdir / 'checkpoints' / '2')
  assert capfd.readouterr().err == (
      f'note: checkpoint {workdir}/checkpoints/4 is damaged ({name} does not match its '
      'checksum); reading the newest healthy one\n')
  with pytest.raises(restore.Damaged, match=rf'^checkpoint {workdir}/checkpoints/4 is damaged '
                                            rf'\({name} does not match its checksum\): use '
                                            r'another step \(--checkpoint=STEP; '):
    bundle_lib.from_workdir(str(workdir), '4')
  assert file_tree(workdir) == before  # a reader moves nothing


def test_a_restore_out_of_memory_stops_with_one_line_and_moves_nothing(tmp_path, data_dir):
  """The restore runs with its address space capped 200 MB above what the process maps: room for
  its threads, not for the 25.6 MB head (200,000 classes) on each of the 8 devices. XLA's
  allocation fails (RESOURCE_EXHAUSTED), as in a resume on a machine with too little memory."""
  workdir = tmp_path / 'work'
  _train_wide(workdir, data_dir)
  before = file_tree(workdir / 'checkpoints')
  proc = subprocess.run(
      _command(workdir, data_dir, '--config.total_steps=3', '--config.eval_every=3',
               '--config.num_classes=200000', '--config.eval_batch_size=64',
               '--allow_config_change', tool='tests/tools/memory_limit_main.py'),
      cwd=ROOT, env=_env(MEMORY_LIMIT_MARGIN=str(200 << 20)), capture_output=True, text=True,
      timeout=300)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert lines[-1].startswith(f'error: cannot read checkpoint 2 in {workdir}/checkpoints ('), lines
  assert 'RESOURCE_EXHAUSTED' in lines[-1]
  assert lines[-1].endswith('its files pass the integrity check, so it stays where it is: free '
                            'memory (or raise the memory limit: ulimit -v) for the restore, then '
                            'rerun the same command'), lines[-1]
  assert file_tree(workdir / 'checkpoints') == before
  assert not (workdir / 'corrupt_checkpoints').exists()


@pytest.fixture(scope='module')
def wide_run(tmp_path_factory, data_dir):
  """A finished 2-step run whose head (200,000 classes) takes 25.6 MB on each of 8 devices."""
  workdir = tmp_path_factory.mktemp('wide') / 'work'
  _train_wide(workdir, data_dir)
  return workdir


@pytest.mark.parametrize('margin_mb', [50])
def test_a_restore_out_of_memory_is_its_line_and_nothing_after_it(tmp_path, data_dir, wide_run,
                                                                  margin_mb):
  """Tighter limits than above: the restore fails in tensorstore's reads or in starting its
  threads, and its background tasks fail after the error line (asyncio's 'exception was never
  retrieved', 'Exception ignored in: <coroutine ...>'): none of that is printed, and the lock
  is released."""
  workdir = tmp_path / 'work'
  shutil.copytree(wide_run, workdir)
  before = file_tree(workdir / 'checkpoints')
  proc = subprocess.run(
      _command(workdir, data_dir, '--config.total_steps=3', '--config.eval_every=3',
               '--config.num_classes=200000', '--config.eval_batch_size=64',
               '--allow_config_change', tool='tests/tools/memory_limit_main.py'),
      cwd=ROOT, env=_env(MEMORY_LIMIT_MARGIN=str(margin_mb << 20)), capture_output=True,
      text=True, timeout=300)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(lines) == 2 and lines[0].startswith('note: the head has num_classes=200000'), lines
  assert lines[1].startswith(f'error: cannot read checkpoint 2 in {workdir}/checkpoints (')
  assert lines[1].endswith('free memory (or raise the memory limit: ulimit -v) for the restore, '
                           'then rerun the same command'), lines[1]
  assert 'bound method' not in lines[1]
  assert file_tree(workdir / 'checkpoints') == before
  assert not (workdir / 'run.lock').exists()


def test_a_run_that_starts_below_a_set_aside_checkpoint_says_so(tmp_path, data_dir, finished_run,
                                                                 capfd):
  workdir = tmp_path / 'work'
  shutil.copytree(finished_run, workdir)
  (workdir / 'corrupt_checkpoints').mkdir()
  os.rename(workdir / 'checkpoints' / '4', workdir / 'corrupt_checkpoints' / '4-1700000000')
  capfd.readouterr()
  loop.train_and_evaluate(_config(data_dir, total_steps=4, checkpoint_every=2), str(workdir))
  err = capfd.readouterr().err
  assert (f'note: starting from step 2 while the newer checkpoint(s) 4 sit in '
          f'{workdir}/corrupt_checkpoints (set aside as damaged); the steps after 2 are trained '
          f'again') in err, err


# ---------------------------------------------------------------------------------------------
# A real full disk: a tmpfs of a few MB.


@contextlib.contextmanager
def _tmpfs(mount, size: str):
  """A real file system of `size` (tmpfs) mounted at `mount` while inside."""
  mount.mkdir()
  subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(mount)], check=True)
  try:
    yield mount
  finally:
    subprocess.run(['umount', '-l', str(mount)], check=True)


@pytest.fixture
def small_disk(tmp_path):
  with _tmpfs(tmp_path / 'disk', '8m') as mount:
    yield mount


def _fill(mount, leave: int) -> None:
  stat = os.statvfs(mount)
  free = stat.f_bavail * stat.f_frsize
  with open(mount / 'filler', 'wb') as f:
    f.write(b'\0' * max(0, free - leave))


def test_a_checkpoint_on_a_full_disk_is_one_line_and_leaves_no_temporary_folder(
    small_disk, data_dir, finished_run):
  workdir = small_disk / 'work'
  shutil.copytree(finished_run, workdir)
  before = file_tree(workdir / 'checkpoints')
  size = sum(len(v) for k, v in before.items() if k.startswith('4/'))
  _fill(small_disk, size // 3)  # room for the metrics, not for a checkpoint
  with pytest.raises(UserError, match=rf'^cannot write a checkpoint to {workdir}/checkpoints \(No '
                                      r'space left on device\): free space or fix permissions '
                                      r'there, then rerun the same command to resume from the '
                                      r'checkpoint of step 4$'):
    loop.train_and_evaluate(_config(data_dir, total_steps=6, checkpoint_every=2), str(workdir),
                            allow_config_change=True)
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['2', '4']  # no temporary folder
  assert file_tree(workdir / 'checkpoints') == before
  assert _train_steps(workdir)[-1] == 6  # the log of what was trained is whole


@pytest.fixture
def tiny_disk(tmp_path):
  with _tmpfs(tmp_path / 'tiny', '3m') as mount:
    yield mount


def test_a_disk_that_fills_during_a_save_is_one_line_and_nothing_else(tiny_disk, data_dir):
  """A real 3 MB disk that a checkpoint a step fills (one device: the save of step 2 fails while
  tensorstore still writes): the run's line, then the error line; none of the tracebacks of
  tensorstore's callbacks into orbax's closed event loops; the checkpoint of step 1 stands."""
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  workdir = tiny_disk / 'work'
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main',
       '--config=configs/default.py:model_name=ViT-Mu/4,steps=40,batch_size=16',
       '--config.warmup_steps=1', '--config.progress=False', f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', '--config.checkpoint_every=1', '--config.eval_every=100'],
      cwd=ROOT, env=_env(XLA_FLAGS=xla_flags(1)), capture_output=True, text=True, timeout=300)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(lines) == 2 and lines[0].startswith('training on mnist5k'), proc.stderr[-3000:]
  assert lines[1] == (f'error: cannot write a checkpoint to {workdir}/checkpoints (No space left '
                      'on device): free space or fix permissions there, then rerun the same '
                      'command to resume from the checkpoint of step 1'), lines
  assert os.listdir(workdir / 'checkpoints') == ['1']
  restore.load_checkpoint(workdir / 'checkpoints' / '1')


# ---------------------------------------------------------------------------------------------
# SIGHUP, closed pipes, and the stop save's train metrics.


def _wait_for_step(proc, workdir, step, timeout=300):
  deadline = time.monotonic() + timeout
  while not os.path.exists(workdir / 'metrics.jsonl') or max(
      _train_steps(workdir), default=0) < step:
    assert proc.poll() is None, proc.communicate()[1]
    assert time.monotonic() < deadline
    time.sleep(0.02)


def test_sighup_saves_like_sigterm_and_every_step_is_in_one_record(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  proc = subprocess.Popen(_command(workdir, data_dir, '--config.total_steps=400',
                                   '--config.eval_every=400', '--config.checkpoint_every=1000'),
                          cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  _wait_for_step(proc, workdir, 4)
  proc.send_signal(signal.SIGHUP)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  last = err.strip().splitlines()[-1]
  assert last.startswith('preempted: saved the checkpoint of step '), err
  saved = int(last.split('step ')[1].split(' ')[0])
  assert os.listdir(workdir / 'checkpoints') == [str(saved)]
  steps = _train_steps(workdir)
  assert steps[-1] == saved, (steps, saved)  # the stop save logged the steps since the last record
  assert steps == sorted(set(steps))


def test_a_closed_output_pipe_never_stops_the_run(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  command = ' '.join(_command(workdir, data_dir, '--config.checkpoint_every=4'))
  proc = subprocess.run(['bash', '-c', f'{command} 2>&1 | head -1; exit ${{PIPESTATUS[0]}}'],
                        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert len(proc.stdout.splitlines()) == 1
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['12', '4', '8']
  assert _train_steps(workdir) == [4, 8, 12]


def test_a_closed_stdout_alone_never_stops_the_run(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  read, write = os.pipe()
  os.close(read)  # nobody reads stdout: the final print meets a closed pipe
  proc = subprocess.run(_command(workdir, data_dir, '--config.total_steps=2'), cwd=ROOT,
                        env=_env(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
  os.close(write)
  assert proc.returncode == 0 and 'Traceback' not in proc.stderr, proc.stderr
  assert os.listdir(workdir / 'checkpoints') == ['2']


@pytest.mark.parametrize('redirect,wrapper', [('>&-', False), ('2>&-', True), ('>&- 2>&-', True)],
                         ids=['stdout', 'stderr-through-a-script', 'both-through-a-script'])
def test_a_standard_stream_closed_at_start_never_stops_the_run(tmp_path, data_dir, redirect,
                                                               wrapper):
  """Real closed descriptors, through the huge-page restart (huge pages left on): the run trains
  and saves, its output is dropped, and no file of the run receives the run's output (a file
  opened while fd 1 or 2 was closed would take that number). Through a script that `exec`s the
  trainer (`bash run.sh 2>&-`), bash passes the script itself on the lowest closed number,
  read-only: the run must not write to it either."""
  workdir = tmp_path / 'work'
  command = ' '.join(_command(workdir, data_dir, '--config.total_steps=2'))
  env = {k: v for k, v in os.environ.items() if k != 'VIT_JAX_HUGEPAGES'}
  if wrapper:
    script = tmp_path / 'run.sh'
    script.write_text(f'exec {command}\n')
    shell = f'bash {script} {redirect}'
  else:
    shell = f'exec {command} {redirect}'
  proc = subprocess.run(['bash', '-c', shell], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert (proc.stderr == '') == ('2>&-' in redirect), proc.stderr
  assert os.listdir(workdir / 'checkpoints') == ['2']
  assert integrity.damage(workdir / 'checkpoints' / '2') is None
  assert _train_steps(workdir) == [2]
  for path, content in file_tree(workdir).items():
    assert b'training on mnist5k' not in content and b'final test' not in content, path


def test_stdout_to_a_full_device_trains_saves_and_ends_with_one_line_naming_it(tmp_path,
                                                                               data_dir):
  workdir = tmp_path / 'work'
  with open('/dev/full', 'w') as full:
    proc = subprocess.run(_command(workdir, data_dir, '--config.total_steps=2'), cwd=ROOT,
                          env=_env(), stdout=full, stderr=subprocess.PIPE, text=True,
                          timeout=300)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
  assert lines[-1] == ('error: cannot write standard output (/dev/full: No space left on device): '
                       'the command ran to its end, and what it printed from then on was '
                       'dropped; free space there, or send its output elsewhere'), lines
  assert os.listdir(workdir / 'checkpoints') == ['2']  # trained and saved all the same
  assert _train_steps(workdir) == [2]


# ---------------------------------------------------------------------------------------------
# The dataset travels with the checkpoint.


def _folder_config(root, tmp_path, **overrides):
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=2,batch_size=8')
  c.dataset, c.data_dir, c.image_size = f'folder:{root}', str(tmp_path / 'tfds'), 16
  c.pp.train = c.pp.eval = 'resize'
  c.eval_batch_size, c.warmup_steps, c.progress = 8, 1, False
  for key, value in overrides.items():
    c[key] = value
  return c


@pytest.fixture
def folder_run(tmp_path):
  root = tmp_path / 'colours'
  write_colour_folder(str(root), per_class=4)
  workdir = tmp_path / 'work'
  loop.train_and_evaluate(_folder_config(root, tmp_path), str(workdir))
  return root, workdir


def test_a_resume_after_a_class_folder_was_renamed_is_refused_naming_it(tmp_path, folder_run):
  root, workdir = folder_run
  before = file_tree(workdir)
  os.rename(root / 'red', root / 'zucchini')
  with pytest.raises(UserError, match=r"holds a run \(step 2\) trained on other data \(folder:.*"
                                      r"colours: class 'red' renamed to 'zucchini'\): restore the "
                                      r'dataset as it was to resume, use a new --workdir, or pass '
                                      r'--allow_config_change'):
    loop.train_and_evaluate(_folder_config(root, tmp_path), str(workdir))
  assert file_tree(workdir) == before
  # predict and export name the classes the run was trained with, not the folder's new names.
  bundle = bundle_lib.from_workdir(str(workdir))
  assert bundle.class_names == ('blue', 'green', 'red')
  assert 'recorded with the checkpoint' in bundle.source['class_names']
  image = root / 'zucchini' / '0.jpg'
  assert inference.predict(bundle, [str(image)], top_k=3)[0]['top'][0]['class'] in (
      'blue', 'green', 'red')


def test_a_resume_after_images_were_added_is_refused_unless_allowed_then_noted(
    tmp_path, folder_run, capfd):
  root, workdir = folder_run
  for name in ('0.jpg', '2.jpg'):
    shutil.copy(root / 'blue' / name, root / 'blue' / f'extra_{name}')
  config = _folder_config(root, tmp_path, total_steps=3)
  with pytest.raises(UserError, match=r'with another config \(total_steps 2 -> 3\) and trained on '
                                      r'other data \(folder:.*colours: train split 9 -> 11 '
                                      r'images\): restore the dataset'):
    loop.train_and_evaluate(config, str(workdir))
  capfd.readouterr()
  loop.train_and_evaluate(config, str(workdir), allow_config_change=True)
  err = capfd.readouterr().err
  assert 'note: --allow_config_change: continuing the run of' in err and 'on changed data (' in err
  assert '3' in os.listdir(workdir / 'checkpoints')


def test_allow_config_change_names_an_added_class_folder_as_the_shape_change(tmp_path,
                                                                              folder_run):
  root, workdir = folder_run
  shutil.copytree(root / 'blue', root / 'cyan')
  with pytest.raises(UserError, match=r"on other data \(folder:.*colours: num_classes 3 -> 4\), "
                                      r'so its arrays have other shapes \(params/head/bias .*; '
                                      r"class 'cyan' added"):
    loop.train_and_evaluate(_folder_config(root, tmp_path, total_steps=3), str(workdir),
                            allow_config_change=True)


def test_a_run_refused_after_its_data_is_opened_leaves_no_workdir(tmp_path, data_dir):
  """The ReaL evaluator refuses a dataset without ReaL labels once the run's data is open and
  its metric logger made: the logger has opened no file, so the new workdir is removed whole."""
  workdir = tmp_path / 'work'
  config = _config(data_dir, total_steps=2)
  config.evals.real.every, config.evals.real.dataset = None, 'mnist5k'
  with pytest.raises(UserError, match=r"^dataset 'mnist5k' has no 'image' image with a "
                                      r"'real_label' sequence"):
    loop.train_and_evaluate(config, str(workdir))
  assert not workdir.exists(), file_tree(workdir)


def test_out_of_memory_after_the_restore_is_one_line_and_moves_nothing(tmp_path, data_dir,
                                                                      finished_run):
  """The address space stays capped 300 MB above what the process maps once the restore is
  done: the restore succeeds, the input pipeline's start cannot map TensorFlow's library (an
  ImportError). One line, exit 2, every checkpoint where it was."""
  workdir = tmp_path / 'work'
  shutil.copytree(finished_run, workdir)
  before = file_tree(workdir / 'checkpoints')
  proc = subprocess.run(
      _command(workdir, data_dir, '--config.total_steps=6', '--config.eval_every=6',
               '--allow_config_change', tool='tests/tools/memory_limit_main.py'),
      cwd=ROOT, env=_env(MEMORY_LIMIT_MARGIN=str(300 << 20), MEMORY_LIMIT_KEEP='1'),
      capture_output=True, text=True, timeout=300)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert lines[-1].startswith('error: out of memory ('), lines
  assert lines[-1].endswith('): free memory (or raise the memory limit: ulimit -v), then rerun '
                            'the same command'), lines
  assert lines[-2].startswith('resumed from'), lines  # the restore itself fitted
  assert file_tree(workdir / 'checkpoints') == before
  assert not (workdir / 'corrupt_checkpoints').exists()
