"""Sweeps: expansion, the paper's dev-split choice, tables and plot, resuming a killed sweep, and
stopping one (signals forwarded to its trainers, none left running, one sweep per directory)."""

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from vit_jax.tools import sweeps
from vit_jax.errors import UserError
from vit_jax.tools.sweeps import report, runner, spec as spec_lib
from helpers import ROOT, write_sweep_spec



def _write_spec(tmp_path, data_dir, *, select=True, steps=4, grid=None):
  grid = grid or {'lr': [0.001, 0.01], 'seed': [0, 1]}
  selection = ("{'dev': {'train_split': 'train[:90%]', 'eval_split': 'train[90%:]'}, "
               "'final': {}}") if select else 'None'
  return write_sweep_spec(tmp_path, data_dir, steps=steps, grid=grid,
                          overrides=f"'eval_every': {steps}, 'eval_batch_size': 400",
                          extra=f"'select': {selection},")


def test_spec_expansion_and_errors(tmp_path, data_dir):
  sweep = spec_lib.load(_write_spec(tmp_path, data_dir))
  runs = sweep.grid_runs()
  assert [r.name for r in runs] == ['grid/lr_0.001-seed_0', 'grid/lr_0.001-seed_1',
                                    'grid/lr_0.01-seed_0', 'grid/lr_0.01-seed_1']
  overrides = dict(runs[1].overrides)
  assert overrides['lr'] == 0.001 and overrides['seed'] == 1
  assert overrides['eval_split'] == 'train[90%:]' and overrides['warmup_steps'] == 1
  assert runs[0].setting() == runs[1].setting() == (('lr', 0.001),)  # seeds are replicates
  final = sweep.final_runs([(('lr', 0.01),)])
  assert [r.name for r in final] == ['final/lr_0.01-seed_0', 'final/lr_0.01-seed_1']
  assert 'eval_split' not in dict(final[0].overrides)  # the final runs report on the test split
  assert runner.command(sweep, runs[1], '/w')[3:] == [
      '--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps=4,batch_size=32', '--workdir=/w',
      '--config.warmup_steps=1', f'--config.data_dir={data_dir}', '--config.progress=False',
      '--config.eval_every=4', '--config.eval_batch_size=400', '--config.train_split=train[:90%]',
      '--config.eval_split=train[90%:]', '--config.lr=0.001', '--config.seed=1']
  bad = tmp_path / 'bad.py'
  for text, needle in [('x = 1', 'no get_sweep'),
                       ('def get_sweep():\n  return {"config": "c.py", "grid": {}}',
                        'non-empty "grid"'),
                       ('def get_sweep():\n  return {"config": "c.py", "grid": {"lr": [1]}, '
                        '"x": "wd"}', 'must be one of the grid keys'),
                       ('def get_sweep():\n  return {"config": "c.py", "grd": {}}',
                        r'unknown key\(s\) grd'),
                       ('def get_sweep():\n  return {"config": "c.py", "grid": {"w": [(1, 2)]}}',
                        r"value\(s\) \[\(1, 2\)\] that are not a str.*name them in \"variants\""),
                       ('def get_sweep():\n  return {"config": "c.py", "ranges": {"lr": '
                        '{"low": 0.1, "high": 1}}}', 'give "trials"'),
                       ('def get_sweep():\n  return {"config": "c.py", "trials": 3, "ranges": '
                        '{"lr": {"low": 0, "high": 1, "log": True}}}', r'"log": True \(then L > 0\)'),
                       ('def get_sweep():\n  return {"config": "c.py", "grid": {"lr": [1]}, '
                        '"trials": 3}', '"trials" in .* needs "ranges"'),
                       ('def get_sweep():\n  return {"config": "c.py", "grid": {"lr": [1]}, '
                        '"pruner": "best"}', 'NAME one of median, percentile, halving'),
                       ('def get_sweep():\n  return {"config": "c.py", "trials": 3, "ranges": '
                        '{"lr": {"low": 0, "high": 1}}, "sampler": "cma"}', 'unknown sampler')]:
    bad.write_text(text)
    with pytest.raises(UserError, match=needle):
      spec_lib.load(str(bad))
  with pytest.raises(UserError, match='is not a file'):
    spec_lib.load(str(tmp_path / 'missing.py'))


def test_aggregate_and_best_per_group():
  def outcome(values, metric):
    return runner.Outcome(spec_lib.Run('grid', values, values), 'done', metric)
  outcomes = [outcome((('pool', 'tok'), ('lr', 1), ('seed', s)), m) for s, m in ((0, .5), (1, .7))]
  outcomes += [outcome((('pool', 'tok'), ('lr', 2), ('seed', 0)), .65)]
  outcomes += [outcome((('pool', 'gap'), ('lr', 1), ('seed', 0)), .9)]
  outcomes += [runner.Outcome(spec_lib.Run('grid', (('pool', 'gap'), ('lr', 2)), ()), 'failed')]
  rows = report.aggregate(outcomes)
  first = rows[0]
  assert first.metrics == [.5, .7] and first.mean == pytest.approx(.6)
  assert first.std == pytest.approx(0.1414213, rel=1e-5)  # sample std over the seeds
  assert report.best_settings(rows, None) == [(('pool', 'gap'), ('lr', 1))]
  # Per group: tok's best is lr 2 (0.65 > mean 0.6), gap's is lr 1 (lr 2 failed).
  assert report.best_settings(rows, 'pool') == [(('pool', 'gap'), ('lr', 1)),
                                                (('pool', 'tok'), ('lr', 2))]


def test_sweep_runs_chooses_on_dev_and_writes_table_and_plot(tmp_path, data_dir):
  spec = _write_spec(tmp_path, data_dir)
  workdir = tmp_path / 'sweep'
  summary = sweeps.run_sweep(spec, str(workdir), launcher='inline', say=lambda m: None)
  with open(workdir / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r['phase'] for r in rows] == ['grid'] * 4 + ['final'] * 2
  assert all(r['status'] == 'done' and 0 <= float(r['accuracy']) <= 1 for r in rows)
  # The best lr is the one with the higher mean dev accuracy over the two seeds ...
  dev = {}
  for r in rows[:4]:
    with open(workdir / r['run'] / 'sweep_result.json') as f:
      dev.setdefault(float(r['lr']), []).append(json.load(f)['metric'])
  best_lr = max(dev, key=lambda lr: sum(dev[lr]))
  assert summary['best'] == [{'lr': best_lr}]
  # ... evaluated on the 10% dev split (400 images); the final runs on the test split (1,000).
  counts = {r['run']: json.loads(open(workdir / r['run'] / 'metrics.jsonl').readlines()[-1])[
      'count'] for r in rows}
  assert {counts[r['run']] for r in rows[:4]} == {400.0}
  assert {counts[r['run']] for r in rows[4:]} == {1000.0}
  assert all(float(r['lr']) == best_lr for r in rows[4:])
  table = (workdir / 'results.md').read_text()
  marked = [line for line in table.splitlines() if line.startswith('|') and '**' in line]
  assert len(marked) == 1 and marked[0].startswith(f'| {best_lr} | **') and 'Final runs' in table
  with open(workdir / 'accuracy_vs_lr.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  # The study (study.db in the workdir): one COMPLETE trial per run, the grid's values as params.
  import optuna  # pylint: disable=g-import-not-at-top
  storage = f'sqlite:///{workdir}/study.db'
  grid = optuna.load_study(study_name=str(workdir), storage=storage).get_trials()
  assert sorted((t.params['lr'], t.params['seed'], t.state.name, t.value) for t in grid) == sorted(
      (float(r['lr']), int(r['seed']), 'COMPLETE', float(r['accuracy'])) for r in rows[:4])
  final = optuna.load_study(study_name=f'{workdir}/final', storage=storage).get_trials()
  assert sorted((t.user_attrs['run'], t.value) for t in final) == sorted(
      (r['run'], float(r['accuracy'])) for r in rows[4:])
  # A rerun finds every run finished and trains nothing.
  said = []
  sweeps.run_sweep(spec, str(workdir), launcher='inline', say=said.append)
  assert len(said) == 6 and all('finished before' in m for m in said)


def test_killed_sweep_reruns_only_the_unfinished_runs(tmp_path, data_dir):
  spec = _write_spec(tmp_path, data_dir, select=False, grid={'lr': [0.001, 0.003, 0.01, 0.03]})
  workdir = tmp_path / 'sweep'
  cmd = [sys.executable, '-m', 'vit_jax', 'sweep', f'--sweep={spec}', f'--workdir={workdir}',
         '--launcher=inline']
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  results = lambda: sorted(str(p.parent.name) for p in workdir.glob('grid/*/sweep_result.json'))
  deadline = time.monotonic() + 600
  while len(results()) < 2:
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  finished = results()
  assert 2 <= len(finished) < 4
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  for name in finished:
    assert f'grid/{name}: finished before' in proc.stderr
  ran = [l for l in proc.stderr.splitlines() if l.endswith(': running')]
  assert len(ran) == 4 - len(finished)
  assert len(results()) == 4
  assert '| lr | accuracy |' in proc.stdout


def test_a_result_cut_short_by_a_kill_reads_as_unfinished_and_results_are_written_whole(
    tmp_path, monkeypatch):
  """A sweep killed while writing a run's sweep_result.json (the rerun once
  died on an empty file with a JSONDecodeError traceback) leaves a file the rerun treats as not
  finished; results are now written to a temporary file and renamed, so a reader sees none or
  all."""
  path = tmp_path / 's.py'
  path.write_text("def get_sweep():\n  return {'config': 'c.py', 'grid': {'lr': [0.1]}}\n")
  run = spec_lib.load(str(path)).grid_runs()[0]
  os.makedirs(runner.run_dir(str(tmp_path), run))
  result = os.path.join(runner.run_dir(str(tmp_path), run), runner.RESULT)
  for partial in ('', '{"metric": 0.5, "sec'):
    with open(result, 'w') as f:
      f.write(partial)
    assert runner.read_result(str(tmp_path), run) is None
  written = []
  real_replace = os.replace
  monkeypatch.setattr(os, 'replace', lambda src, dst: (written.append(
      (dst, open(src).read())), real_replace(src, dst))[1])
  runner.write_result(runner.run_dir(str(tmp_path), run), run, 0.25, 3.0, 7)
  assert [d for d, _ in written] == [result]
  assert json.loads(written[0][1])['metric'] == 0.25
  assert runner.read_result(str(tmp_path), run)['step'] == 7


def test_variants_name_sets_of_overrides_and_templates_use_run_values(tmp_path):
  path = tmp_path / 'two_stage.py'
  path.write_text('''
def get_sweep():
  return {
      'config': 'configs/finetune.py:model=Mu/4,dataset=digits',
      'overrides': {'lr': 0.01},
      'grid': {'start': ['scratch', 'pretrained'], 'seed': [0, 1]},
      'variants': {'start': {'scratch': {}, 'pretrained': {'init': 'runs/pre/grid/seed_{seed}'}}},
  }
''')
  runs = spec_lib.load(str(path)).grid_runs()
  assert [(r.name, dict(r.overrides)) for r in runs] == [
      ('grid/start_scratch-seed_0', {'lr': 0.01, 'seed': 0}),
      ('grid/start_scratch-seed_1', {'lr': 0.01, 'seed': 1}),
      ('grid/start_pretrained-seed_0', {'lr': 0.01, 'init': 'runs/pre/grid/seed_0', 'seed': 0}),
      ('grid/start_pretrained-seed_1', {'lr': 0.01, 'init': 'runs/pre/grid/seed_1', 'seed': 1})]
  path.write_text(path.read_text().replace("'scratch': {}, ", ''))
  with pytest.raises(UserError, match=r"variants\['start'\] .* has no overrides for \['scratch'\]"):
    spec_lib.load(str(path))


def test_markdown_of_a_seeds_only_grid_is_a_valid_table(tmp_path):
  path = tmp_path / 'seeds.py'
  path.write_text('def get_sweep():\n  return {"config": "c.py", "grid": {"seed": [0, 1]}}\n')
  sweep = spec_lib.load(str(path))
  outcomes = [runner.Outcome(run, 'done', metric)
              for run, metric in zip(sweep.grid_runs(), (0.7, 0.8))]
  rows = report.aggregate(outcomes)
  table = [l for l in report.markdown(sweep, rows, [], report.best_settings(rows, None))
           .splitlines() if l.startswith('|')]
  assert table == ['| setting | accuracy |', '|---|---|', '| base | **75.00 ± 7.07 (n=2)** |']


# ---------------------------------------------------------------------------------------------
# Stopping a sweep: signals reach its trainers, which save; none is left running.


def _long_spec(tmp_path, data_dir, runs=2):
  return _write_spec(tmp_path, data_dir, select=False, steps=100000,
                     grid={'lr': [0.001, 0.01, 0.03][:runs]})


def _start_sweep(spec, workdir, *extra):
  return subprocess.Popen(
      [sys.executable, '-m', 'vit_jax', 'sweep', f'--sweep={spec}', f'--workdir={workdir}', *extra],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trainer_pid(run_workdir, sweep, deadline_s=300) -> int:
  """The PID of the trainer in `run_workdir` (from its lock), once it has trained a step."""
  deadline = time.monotonic() + deadline_s
  while True:
    assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
    if (run_workdir / 'checkpoints').exists() and (run_workdir / 'metrics.jsonl').exists():
      try:
        return json.loads((run_workdir / 'run.lock').read_text())['pid']
      except (OSError, ValueError):
        pass
    time.sleep(0.05)


def _gone(pid, timeout_s=120) -> bool:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return True
    with open(f'/proc/{pid}/stat') as f:  # a zombie (not reaped yet) is gone too
      if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
        return True
    time.sleep(0.1)
  return False


def test_sigterm_to_the_sweep_is_forwarded_and_its_runs_save(tmp_path, data_dir):
  spec = _long_spec(tmp_path, data_dir)
  workdir = tmp_path / 'sweep'
  sweep = _start_sweep(spec, workdir, '--parallel=2')
  runs = [workdir / 'grid' / 'lr_0.001', workdir / 'grid' / 'lr_0.01']
  pids = [_trainer_pid(run, sweep) for run in runs]
  sweep.send_signal(signal.SIGTERM)
  out, err = sweep.communicate(timeout=300)
  assert sweep.returncode == 0 and 'Traceback' not in err, err
  assert err.strip().splitlines()[-1].startswith('stopped: 2 run(s) stopped or not started '), err
  for run, pid in zip(runs, pids):
    assert _gone(pid)
    log = (run / 'log.txt').read_text().strip().splitlines()
    assert log[-1].startswith('preempted: saved the checkpoint of step '), log[-3:]
    step = log[-1].split('step ')[1].split(' ')[0]
    assert step in os.listdir(run / 'checkpoints')
    assert not (run / 'run.lock').exists() and not (run / runner.RESULT).exists()
  assert 'Traceback' not in out and not (workdir / 'results.csv').exists()
  # Both runs are queued again (for a rerun, or another worker, to resume from the checkpoint).
  import optuna  # pylint: disable=g-import-not-at-top
  waiting = optuna.load_study(study_name=str(workdir), storage=f'sqlite:///{workdir}/study.db'
                              ).get_trials(states=(optuna.trial.TrialState.WAITING,))
  assert sorted(t.user_attrs['run'] for t in waiting) == [r.relative_to(workdir).as_posix()
                                                          for r in runs]


def test_kill_9_of_the_sweep_stops_its_trainer_with_a_checkpoint(tmp_path, data_dir):
  spec = _long_spec(tmp_path, data_dir, runs=1)
  workdir = tmp_path / 'sweep'
  sweep = _start_sweep(spec, workdir)
  run = workdir / 'grid' / 'lr_0.001'
  pid = _trainer_pid(run, sweep)
  sweep.kill()
  sweep.communicate()
  assert _gone(pid), 'the trainer outlived its sweep'
  log = (run / 'log.txt').read_text().strip().splitlines()
  assert log[-1].startswith('preempted: saved the checkpoint of step '), log[-3:]
  assert log[-1].split('step ')[1].split(' ')[0] in os.listdir(run / 'checkpoints')
  assert not (run / 'run.lock').exists()


def test_rerun_finds_a_trainer_still_holding_a_run_and_says_so(tmp_path, data_dir):
  """A trainer of an earlier sweep still runs in a run's workdir (here: this process holds its
  lock): the run is not started a second time, and the line names the holder."""
  from vit_jax.run import lock  # pylint: disable=g-import-not-at-top
  spec = _long_spec(tmp_path, data_dir, runs=1)
  root = tmp_path / 'sweep'
  (root / 'grid' / 'lr_0.001').mkdir(parents=True)
  held = lock.WorkdirLock(str(root / 'grid' / 'lr_0.001')).acquire()
  said = []
  try:
    summary = sweeps.run_sweep(spec, str(root), say=said.append, lock_wait_s=0)
  finally:
    held.release()
  assert summary['failed'] == ['grid/lr_0.001']
  assert said[-1] == ('[1/1] grid/lr_0.001: failed (its workdir is in use by '
                      f'{held._me.describe()} (a trainer left running by an earlier sweep?): '
                      'wait for it or stop it, then rerun the same command)')
  assert not (root / 'grid' / 'lr_0.001' / 'log.txt').exists()  # no trainer was started


def test_second_sweep_on_the_same_directory_is_refused(tmp_path, data_dir):
  from vit_jax.run import lock  # pylint: disable=g-import-not-at-top
  spec = _long_spec(tmp_path, data_dir, runs=1)
  (tmp_path / 'sweep').mkdir()
  held = lock.WorkdirLock(str(tmp_path / 'sweep')).acquire()
  try:
    with pytest.raises(lock.WorkdirInUse, match=f'in use by another run \\(pid {os.getpid()} '):
      sweeps.run_sweep(spec, str(tmp_path / 'sweep'), say=lambda m: None)
  finally:
    held.release()
  assert not (tmp_path / 'sweep' / 'grid').exists()


def test_dry_run_prints_the_commands_on_stdout_as_a_script(tmp_path, data_dir):
  spec = _write_spec(tmp_path, data_dir)
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'sweep', f'--sweep={spec}',
                         f'--workdir={tmp_path / "sweep"}', '--dry_run'], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  commands = [shlex.split(l) for l in lines if not l.startswith('# ')]
  assert len(commands) == 4 and all(c[:3] == [sys.executable, '-m', 'vit_jax.main']
                                    for c in commands)
  assert sorted(c[4] for c in commands) == sorted(
      f'--workdir={tmp_path / "sweep" / "grid" / n}' for n in
      ('lr_0.001-seed_0', 'lr_0.001-seed_1', 'lr_0.01-seed_0', 'lr_0.01-seed_1'))
  assert lines[-1].startswith('# then 2 final run(s) of the best setting')
  assert 'vit_jax.main' not in proc.stderr
  assert not (tmp_path / 'sweep').exists()  # a dry run writes nothing


def test_two_workers_taking_the_last_sample_at_once_train_it_once():
  """Ranges with a budget of 2: trial 0 holds a run; two workers ask at once and get trials 1
  and 2 (the storage numbers them one by one). Only trial 2 finds the budget full; a run that
  failed still counts (it is retried, not replaced); a trial that failed before it was named
  never ran and frees its place."""
  import types  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import study as study_lib, worker  # pylint: disable=g-import-not-at-top
  optuna = study_lib._optuna()  # pylint: disable=protected-access
  study = optuna.create_study(direction='maximize')
  phase = worker.Phase(sweep=types.SimpleNamespace(trials=2), study=study, runs=None)
  first = study.ask()
  first.set_user_attr('run', 'grid/lr_0.01')
  second, third = study.ask(), study.ask()
  trials = study.get_trials(deepcopy=False)
  assert not worker._over_budget(phase, second.number, trials)  # pylint: disable=protected-access
  assert worker._over_budget(phase, third.number, trials)  # pylint: disable=protected-access
  assert worker._can_take(phase, trials) is False  # pylint: disable=protected-access
  third.set_user_attr('over_budget', True)
  study.tell(third, state=optuna.trial.TrialState.FAIL)
  study.tell(first, state=optuna.trial.TrialState.FAIL)  # the run failed: still one of the two
  trials = study.get_trials(deepcopy=False)
  assert worker._over_budget(phase, None, trials)  # pylint: disable=protected-access
  study.tell(second, state=optuna.trial.TrialState.FAIL)  # died before it was named
  trials = study.get_trials(deepcopy=False)
  assert not worker._over_budget(phase, None, trials)  # pylint: disable=protected-access
  assert worker._can_take(phase, trials) is True  # pylint: disable=protected-access
