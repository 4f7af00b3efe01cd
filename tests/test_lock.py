"""One writer per workdir (vit_jax/run/lock.py): a held workdir is refused at once naming the
holder, stale locks (dead process, reused PID, silent other host) are taken over, the gs:// code
path (tf.io.gfile, here on ram:// and local paths) decides races by reading back, and a training
run holds the lock from start to end (process 0 only)."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from vit_jax.run import lock
from helpers import ROOT



def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def _write_holder(workdir, **changes):
  record = dataclasses.replace(lock.Holder.of_this_process(), **changes)
  (workdir / lock.LOCK_FILE).write_bytes(record.to_bytes())
  return record


@pytest.mark.slow
def test_second_run_on_a_held_workdir_exits_at_once_naming_the_holder(tmp_path, data_dir):
  workdir = tmp_path / 'work'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('keep me')
  held = lock.WorkdirLock(str(workdir)).acquire()
  try:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', 'vit_jax.main',
         '--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps=4,batch_size=16',
         f'--workdir={workdir}', f'--config.data_dir={data_dir}'],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
  finally:
    held.release()
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert lines[0] == (f'error: --workdir={workdir} is in use by another run (pid {os.getpid()} on '
                      f'host {lock.Holder.of_this_process().host}, started '
                      f'{time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held._me.started))}): '
                      f'wait for it to finish or stop it; if it is gone, delete '
                      f'{workdir}/run.lock')
  assert sorted(os.listdir(workdir)) == ['notes.txt']  # nothing written, the lock released
  assert seconds < 60  # refused before building anything (imports only)


def test_lock_is_exclusive_and_released(tmp_path):
  first = lock.WorkdirLock(str(tmp_path)).acquire()
  assert lock.holder(str(tmp_path)).pid == os.getpid()
  with pytest.raises(lock.WorkdirInUse, match=f'in use by another run \\(pid {os.getpid()} '):
    lock.WorkdirLock(str(tmp_path)).acquire()
  first.release()
  assert not (tmp_path / lock.LOCK_FILE).exists() and lock.holder(str(tmp_path)) is None
  lock.WorkdirLock(str(tmp_path)).acquire().release()


@pytest.mark.parametrize('changes, reason', [
    (lambda: dict(pid=_dead_pid()), 'process {pid} is not running'),
    (lambda: dict(pid_start=1), 'process {pid} is not running'),  # another start time
    (lambda: dict(boot_id='another-boot'), 'its host restarted since'),
    (lambda: dict(host='elsewhere', heartbeat=time.time() - lock.STALE_AFTER_S - 60),
     'no heartbeat for 11 minutes'),
], ids=['dead_process', 'reused_pid', 'host_restarted', 'other_host_silent'])
def test_stale_lock_is_taken_over_with_a_note(tmp_path, changes, reason):
  old = _write_holder(tmp_path, **changes())
  said = []
  held = lock.WorkdirLock(str(tmp_path), say=said.append).acquire()
  assert said == [f'note: took over the lock of a run that is gone ({old.describe()}: '
                  f'{reason.format(pid=old.pid)})']
  assert json.loads((tmp_path / lock.LOCK_FILE).read_text())['token'] == held._me.token
  held.release()


def test_lock_of_a_live_other_host_is_held(tmp_path):
  _write_holder(tmp_path, host='elsewhere', pid=1, heartbeat=time.time() - 60)
  with pytest.raises(lock.WorkdirInUse, match='pid 1 on host elsewhere'):
    lock.WorkdirLock(str(tmp_path)).acquire()
  assert lock.holder(str(tmp_path)).host == 'elsewhere'


def test_unreadable_lock_is_not_broken(tmp_path):
  (tmp_path / lock.LOCK_FILE).write_bytes(b'{"host": "vm", "pi')
  with pytest.raises(lock.WorkdirInUse, match='is being written or damaged: if no other run uses '
                                              'this workdir, delete it'):
    lock.WorkdirLock(str(tmp_path)).acquire()
  assert (tmp_path / lock.LOCK_FILE).read_bytes() == b'{"host": "vm", "pi'


def test_heartbeat_rewrites_the_record(tmp_path, monkeypatch):
  monkeypatch.setattr(lock, 'HEARTBEAT_S', 0.05)
  held = lock.WorkdirLock(str(tmp_path)).acquire()
  first = json.loads((tmp_path / lock.LOCK_FILE).read_text())['heartbeat']
  time.sleep(0.5)
  later = json.loads((tmp_path / lock.LOCK_FILE).read_text())
  held.release()
  assert later['heartbeat'] > first and later['token'] == held._me.token


@pytest.mark.parametrize('where', ['ram', 'local'])
def test_gfile_store_path_holds_refuses_and_releases(tmp_path, monkeypatch, where):
  """The gs:// code path (GfileStore, through tf.io.gfile) on TF's in-memory filesystem and on
  local paths."""
  monkeypatch.setattr(lock, 'SETTLE_S', 0.0)
  workdir = f'ram://lock_test_{os.getpid()}' if where == 'ram' else str(tmp_path)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.io.gfile.makedirs(workdir)
  store = lock.GfileStore()
  assert isinstance(lock.store_for('gs://bucket/run'), lock.GfileStore)
  held = lock.WorkdirLock(workdir, store=store).acquire()
  assert lock.holder(workdir, store).pid == os.getpid()
  with pytest.raises(lock.WorkdirInUse, match='in use by another run'):
    lock.WorkdirLock(workdir, store=store).acquire()
  held.release()
  assert store.read(lock.lock_path(workdir)) is None
  stale = dataclasses.replace(lock.Holder.of_this_process(), pid=_dead_pid()).to_bytes()
  store.replace(lock.lock_path(workdir), stale)
  said = []
  lock.WorkdirLock(workdir, store=store, say=said.append).acquire().release()
  assert 'is not running' in said[0]


def test_gfile_store_race_the_later_writer_wins(tmp_path, monkeypatch):
  """Two runs find no lock and both write (no create-if-absent on gs://): each reads back after
  the settle time, and only the one whose record is there goes on."""
  store = lock.GfileStore()
  first = lock.WorkdirLock(str(tmp_path), store=store)
  second = lock.WorkdirLock(str(tmp_path), store=store)

  def second_writes_meanwhile():
    store.replace(second.path, second._data)  # wrote after `first`, inside its settle time
  monkeypatch.setattr(store, 'settle', second_writes_meanwhile)
  with pytest.raises(lock.WorkdirInUse, match='in use by another run'):
    first.acquire()
  assert store.read(second.path) == second._data


def test_only_process_0_takes_the_lock(tmp_path, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  lock.hold(str(tmp_path)).release()
  assert os.listdir(tmp_path) == []
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  held = lock.hold(str(tmp_path))
  assert os.listdir(tmp_path) == [lock.LOCK_FILE]
  held.release()
