"""Runs under SLURM: the task variables of srun (and Open MPI's mpirun) make one distributed run,
a requeued job takes over its earlier run's workdir lock; then the tier on a real one-node SLURM
(tests/slurm_cluster.py: Debian's slurmctld, slurmd and munge, started here, 2 CPUs), with CPU
processes and gloo:

  - `srun --ntasks=2` of the train command is one run of 2 processes with the losses of one
    process with the same global batch;
  - `launch --slurm` submits a 2-task job whose time limit comes before its last step and
    --status sees it run; at the limit it is warned, saves, is requeued by its batch script and
    resumes; --stop makes it save and end, and the same launch command resumes it again; all of
    it equal to an uninterrupted run (every logged metric, and the parameters saved at the time
    limit, bit for bit);
  - a cancelled job is not requeued;
  - srun tasks given different workdirs stop with one line each and write nothing.

The tier needs root (to install the packages with apt-get when missing and to run the daemons);
elsewhere its tests are skipped with the reason. Its tests share one cluster (one xdist group).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from vit_jax.analysis import inputs
from vit_jax.parallel import mesh
from vit_jax.run import lock
from helpers import ROOT, free_port, records, xla_flags
import slurm_cluster

pytestmark = pytest.mark.xdist_group('slurm')  # one worker: the tier's tests share one cluster

SCHEDULER_VARIABLES = re.compile(r'^(SLURM_|OMPI_|VIT_JAX_|JAX_COORDINATOR)')


@pytest.fixture
def recorded(monkeypatch):
  """A clean environment (no scheduler or vit_jax variables) and the `_initialize` calls that
  `init_distributed` makes, recorded instead of run."""
  for key in list(os.environ):
    if SCHEDULER_VARIABLES.match(key):
      monkeypatch.delenv(key)
  calls = []
  monkeypatch.setattr(mesh, '_initialize', lambda kwargs, what, *args: calls.append((kwargs, what)))
  monkeypatch.setattr(mesh, '_use_gloo_on_cpu', lambda: None)
  return calls


SRUN_TASK = {'SLURM_JOB_ID': '4242', 'SLURM_STEP_NODELIST': 'gpu[017-020],cpu1',
             'SLURM_NTASKS': '8', 'SLURM_PROCID': '5', 'SLURM_LOCALID': '1'}


def test_srun_tasks_join_one_run_through_slurms_variables(recorded, monkeypatch):
  for key, value in SRUN_TASK.items():
    monkeypatch.setenv(key, value)
  mesh.init_distributed()
  port = 4242 % 4096 + 65536 - 4096  # JAX's port for the job: the same on every task
  assert recorded == [(dict(coordinator_address=f'gpu017:{port}', num_processes=8, process_id=5),
                       f"SLURM's task variables (job 4242, task 5 of 8, coordinator "
                       f'gpu017:{port})')]
  recorded.clear()
  monkeypatch.setenv('JAX_COORDINATOR_PORT', '7000')  # JAX's own override of the port
  mesh.init_distributed()
  assert recorded[0][0]['coordinator_address'] == 'gpu017:7000'


def test_flags_and_vit_jax_variables_win_over_the_scheduler(recorded, monkeypatch):
  for key, value in SRUN_TASK.items():
    monkeypatch.setenv(key, value)
  mesh.init_distributed('10.0.0.2:8476', 2, 1)
  monkeypatch.setenv('VIT_JAX_COORDINATOR_ADDRESS', '10.0.0.3:8476')
  monkeypatch.setenv('VIT_JAX_NUM_PROCESSES', '4')
  monkeypatch.setenv('VIT_JAX_PROCESS_ID', '3')
  mesh.init_distributed()
  assert [kwargs for kwargs, _ in recorded] == [
      dict(coordinator_address='10.0.0.2:8476', num_processes=2, process_id=1),
      dict(coordinator_address='10.0.0.3:8476', num_processes=4, process_id=3)]


@pytest.mark.parametrize('variables', [
    dict(SRUN_TASK, SLURM_NTASKS='1', SLURM_PROCID='0'),  # srun --ntasks=1
    {k: v for k, v in SRUN_TASK.items() if k != 'SLURM_STEP_NODELIST'},  # a batch script itself
    {'SLURM_JOB_ID': '4242', 'SLURM_NTASKS': '8'},  # a shell in an allocation (salloc)
    dict(SRUN_TASK, VIT_JAX_NO_AUTO_DISTRIBUTED='1'),
], ids=['one_task', 'batch_shell', 'salloc_shell', 'auto_detection_off'])
def test_one_process_where_the_scheduler_started_only_one(recorded, monkeypatch, variables):
  for key, value in variables.items():
    monkeypatch.setenv(key, value)
  mesh.init_distributed()
  assert recorded == []


def test_open_mpi_ranks_join_one_run(recorded, monkeypatch):
  monkeypatch.setenv('OMPI_MCA_orte_hnp_uri', '1531576320.0;tcp://10.96.0.1,10.148.0.1:34911')
  for key, value in (('SIZE', '4'), ('RANK', '2'), ('LOCAL_RANK', '0')):
    monkeypatch.setenv(f'OMPI_COMM_WORLD_{key}', value)
  mesh.init_distributed()
  port = 1531576320 // 4096 % 4096 + 65536 - 4096
  assert recorded == [(dict(coordinator_address=f'10.96.0.1:{port}', num_processes=4,
                            process_id=2),
                       f"Open MPI's task variables (task 2 of 4, coordinator 10.96.0.1:{port})")]


class _Device:

  def __init__(self, process, kind='cpu', platform='cpu'):
    self.process_index, self.device_kind, self.platform = process, kind, platform


def test_the_first_line_names_the_processes_and_their_devices():
  assert mesh.describe_run([_Device(0), _Device(1)]) == '2 processes x 1 x cpu'
  h100 = [_Device(p, 'NVIDIA H100', 'gpu') for p in range(4) for _ in range(8)]
  assert mesh.describe_run(h100) == '4 processes x 8 x NVIDIA H100'
  assert mesh.describe_run(h100[:1]) == '1 x NVIDIA H100'
  assert mesh.describe_run(h100[:9]) == '2 processes, 9 x NVIDIA H100'  # 8 + 1


@pytest.mark.slow
def test_a_task_whose_peers_never_arrive_stops_with_one_line(tmp_path, data_dir):
  """Task 1 of 2 under srun's variables, with no task 0: one `error:` line after the timeout."""
  env = {k: v for k, v in os.environ.items() if not SCHEDULER_VARIABLES.match(k)}
  port = free_port()
  env.update(SLURM_JOB_ID='77', SLURM_STEP_NODELIST='127.0.0.1', SLURM_NTASKS='2',
             SLURM_PROCID='1', SLURM_LOCALID='1', JAX_COORDINATOR_PORT=str(port),
             XLA_FLAGS=xla_flags(1))
  proc = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', *_config(6, checkpoint_every=3),
       f'--workdir={tmp_path}/work', f'--config.data_dir={data_dir}', '--distributed_timeout=5'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert lines[0] == (
      "error: the distributed runtime did not start within 5 s through SLURM's task variables "
      f'(job 77, task 1 of 2, coordinator 127.0.0.1:{port}): start the same command on all 2 '
      "processes (srun and mpirun start it once per task: the job's log says why others did "
      "not), check that process 0 runs and that its port is reachable, or raise "
      '--distributed_timeout')
  assert not os.path.exists(tmp_path / 'work')


def test_a_requeued_job_takes_over_the_lock_of_its_earlier_run(tmp_path, monkeypatch):
  """Killed at its time limit on one node, the run leaves its lock; the requeued job (on any
  node) takes it over at once, while the earlier run's own job, or another job, still may not."""
  now = time.time()
  earlier = lock.Holder(host='node-that-ran-it', pid=1234, started=now, heartbeat=now, token='x',
                        slurm_job='4242', slurm_restart=0)
  (tmp_path / lock.LOCK_FILE).write_bytes(earlier.to_bytes())
  for job, restart in (('4242', '0'), ('9999', '1')):
    monkeypatch.setenv('SLURM_JOB_ID', job)
    monkeypatch.setenv('SLURM_RESTART_COUNT', restart)
    with pytest.raises(lock.WorkdirInUse, match='in use by another run'):
      lock.WorkdirLock(str(tmp_path)).acquire()
  monkeypatch.setenv('SLURM_JOB_ID', '4242')
  monkeypatch.setenv('SLURM_RESTART_COUNT', '1')
  notes = []
  held = lock.WorkdirLock(str(tmp_path), say=notes.append).acquire()
  assert len(notes) == 1 and notes[0].startswith('note: took over the lock of a run that is gone '
                                                 '(pid 1234 on host node-that-ran-it')
  assert notes[0].endswith(': its SLURM job 4242 was requeued since)')
  mine = lock.Holder.from_bytes((tmp_path / lock.LOCK_FILE).read_bytes())
  assert (mine.slurm_job, mine.slurm_restart) == ('4242', 1)
  held.release()


# ---------------------------------------------------------------------------------------------
# The tier on a real SLURM.

TIMING_KEYS = ('img_per_s', 'mfu')  # measured, not computed: they differ between runs


def _config(steps: int, checkpoint_every: int):
  return [f'--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps={steps},batch_size=32,lr=0.01',
          '--config.warmup_steps=1', '--config.log_every=1', f'--config.eval_every={steps}',
          f'--config.checkpoint_every={checkpoint_every}', '--config.keep_checkpoints=1000',
          '--config.data_sharding=global', '--config.progress=False']


# Never reaches its end here, and saves only when stopped: the jobs below are stopped once the
# steps after their resume are logged.
LONG = _config(100000, checkpoint_every=100000)


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  reason = slurm_cluster.unavailable()
  if reason is not None:
    # Never here (root, Debian's packages): a machine where SLURM cannot start says why in one line.
    pytest.skip(f'no SLURM here: {reason}')
  started = slurm_cluster.Cluster(str(tmp_path_factory.mktemp('slurm')))
  try:
    yield started.start()
  finally:
    started.stop()  # every daemon by its PID, its jobs cancelled first


@pytest.fixture
def task_env(cluster):
  """The environment of SLURM's clients here (sbatch exports it to the job): one CPU device per
  process."""
  yield dict(cluster.env, XLA_FLAGS=xla_flags(1))
  jobs = cluster.jobs()  # whatever the test's outcome, no job outlives it
  if jobs:
    cluster.run(['scancel', *jobs], check=False)
    _wait_for('the jobs to end', lambda: not cluster.jobs(), 120)


def _wait_for(what, predicate, timeout_s=600, about=lambda: ''):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f'timed out after {timeout_s} s waiting for {what}\n{about()}')
    time.sleep(0.5)


def _text(path) -> str:
  try:
    with open(path, errors='replace') as f:
      return f.read()
  except FileNotFoundError:
    return ''


def _last_step(workdir) -> int:
  """The last train step a run has logged so far (a line still being written is left out)."""
  steps = [0]
  for line in _text(os.path.join(workdir, 'metrics.jsonl')).splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if record['split'] == 'train':
      steps.append(record['step'])
  return max(steps)


class Uninterrupted:
  """The reference: LONG on 2 processes x 1 device on 127.0.0.1 (explicit flags, no SLURM),
  saving at step `checkpoint` (and its multiples), stopped once it has trained the steps a test
  compares."""

  def __init__(self, workdir, data_dir, checkpoint: int):
    self.workdir = str(workdir)
    port, env = free_port(), dict(os.environ, XLA_FLAGS=xla_flags(1))
    os.makedirs(self.workdir)
    self.logs = [os.path.join(self.workdir, f'process{i}.txt') for i in range(2)]
    self.procs = []
    for i in range(2):
      with open(self.logs[i], 'w') as out:
        self.procs.append(subprocess.Popen(
            [sys.executable, '-m', 'vit_jax.main', *LONG, f'--config.checkpoint_every={checkpoint}',
             f'--workdir={self.workdir}', f'--config.data_dir={data_dir}',
             f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))

  def train_to(self, step: int) -> None:
    def there():
      for p, log in zip(self.procs, self.logs):
        assert p.poll() is None, _text(log)
      return _last_step(self.workdir) >= step
    _wait_for(f'the uninterrupted run to reach step {step}', there)

  def stop(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    for p in self.procs:
      try:
        p.wait(timeout=120)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.fixture
def uninterrupted(tmp_path, data_dir):
  """Starts the reference once a test knows the step its job saved at (run concurrently with the
  job's resumed run); stopped at the end whatever the outcome."""
  started = []

  def start(checkpoint: int) -> Uninterrupted:
    started.append(Uninterrupted(tmp_path / 'uninterrupted', data_dir, checkpoint))
    return started[-1]
  yield start
  for run in started:
    run.stop()


def _assert_equal_runs(job_workdir, reference: Uninterrupted, saved_at: int) -> None:
  """Every train record the job logged equals the uninterrupted run's, bit for bit (timings
  aside), and so do the parameters it saved at `saved_at`, the step its next run resumed from."""
  logged = records(job_workdir, 'train')
  last = logged[-1]['step']
  assert [r['step'] for r in logged] == list(range(1, last + 1)) and last > saved_at
  reference.train_to(last)
  reference.stop()
  expected = {r['step']: r for r in records(reference.workdir, 'train')}
  for record in logged:
    a, b = ({k: v for k, v in r.items() if k not in TIMING_KEYS}
            for r in (record, expected[record['step']]))
    assert a == b, (record['step'], a, b)
  params = [inputs.load_checkpoint(f'{w}/checkpoints/{saved_at}')[0]
            for w in (job_workdir, reference.workdir)]
  leaves = [jax.tree_util.tree_leaves_with_path(p) for p in params]
  assert [p for p, _ in leaves[0]] == [p for p, _ in leaves[1]]
  for (path, x), (_, y) in zip(*leaves):
    assert np.array_equal(x, y), jax.tree_util.keystr(path)


@pytest.mark.slow
def test_srun_tasks_form_one_run_with_the_losses_of_one_process(cluster, task_env, tmp_path,
                                                                data_dir):
  steps, config = 6, _config(6, checkpoint_every=3)
  srun = subprocess.Popen(
      ['srun', '--ntasks=2', '--kill-on-bad-exit=1', sys.executable, '-m', 'vit_jax.main',
       *config, f'--workdir={tmp_path}/srun', f'--config.data_dir={data_dir}'],
      cwd=ROOT, env=task_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  one = subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main', *config, f'--workdir={tmp_path}/one',
       f'--config.data_dir={data_dir}'],
      cwd=ROOT, env=dict(os.environ, XLA_FLAGS=xla_flags(2)), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  (out_srun, err_srun), (out_one, err_one) = (p.communicate(timeout=600) for p in (srun, one))
  assert srun.returncode == 0 and one.returncode == 0, err_srun + err_one
  assert 'on 2 processes x 1 x cpu' in err_srun and 'on 2 x cpu' in err_one
  assert 'in use by another run' not in err_srun
  expected = {r['step']: r['loss'] for r in records(tmp_path / 'one', 'train')}
  got = {r['step']: r['loss'] for r in records(tmp_path / 'srun', 'train')}
  assert sorted(got) == sorted(expected) == list(range(1, steps + 1))
  assert max(expected.values()) - min(expected.values()) > 0.01  # the comparison means something
  np.testing.assert_allclose([got[s] for s in expected], list(expected.values()), rtol=1e-5)
  # One run: one metrics log (process 0's), one set of checkpoints, the same final line twice.
  assert [(r['step'], r['split']) for r in records(tmp_path / 'srun')] == [
      (s, 'train') for s in range(1, steps + 1)] + [(steps, 'eval')]
  assert sorted(os.listdir(tmp_path / 'srun' / 'checkpoints')) == ['3', '6']
  finals = [line for line in out_srun.splitlines() if line.startswith('final ')]
  assert finals == [out_one.strip().splitlines()[-1]] * 2, out_srun


def _launcher(task_env, launch_dir):
  def launch(*args):
    return subprocess.run(
        [sys.executable, '-m', 'vit_jax', 'launch', '--slurm', f'--launch_dir={launch_dir}',
         *args], cwd=ROOT, env=task_env, capture_output=True, text=True, timeout=300)
  return launch


def _submitted(proc) -> str:
  assert proc.returncode == 0, proc.stderr
  found = re.match(r'submitted job (\d+): ', proc.stdout)
  assert found, proc.stdout
  return found.group(1)


def _state(cluster, job) -> str:
  return cluster.run(['squeue', '-h', '-t', 'all', '-j', job, '-o', '%T']).stdout.strip()


def _saves(text: str) -> list:
  return [int(s) for s in re.findall(r'preempted: saved the checkpoint of step (\d+)', text)]


def _resumed_after_requeue(text: str, job: str, workdir) -> int | None:
  """S where a run of `job` saved at step S, the batch shell requeued the job and a later run of
  it resumed at S; None before that."""
  for saved in re.finditer(r'preempted: saved the checkpoint of step (\d+)', text):
    after = text[saved.end():]
    requeued = after.find(f'== requeueing job {job}: ')
    restart = re.search(rf'== job {job}, restart \d+: ', after[max(requeued, 0):])
    if requeued >= 0 and restart and (
        f'resumed from {workdir}/checkpoints at step {saved.group(1)}\n'
        in after[requeued + restart.end():]):
      return int(saved.group(1))
  return None


@pytest.mark.slow
def test_a_launched_job_saves_at_its_time_limit_is_requeued_stopped_and_resumed_exactly(
    cluster, task_env, tmp_path, data_dir, uninterrupted):
  """launch --slurm submits a 2-task job with --time=2 and --signal_lead=40. SLURM checks its
  jobs every 30 s and sends the warning at its first check within 30 s of the lead: 50 to 80 s
  after the start. The trainer saves, the batch shell requeues the job, its next run resumes;
  --stop then saves and ends it, and the same launch command resumes it again. (A run whose
  start-up outlasts the warning is ended by it; the requeue tries again. After the first save the
  test lengthens the limit, so that later warnings do not race its steps.)"""
  launch_dir, workdir = tmp_path / 'launch', tmp_path / 'work'
  launch = _launcher(task_env, launch_dir)
  log = launch_dir / 'log.txt'
  submit = ['--tasks_per_node=2', '--time=2', '--signal_lead=40', '--', 'python', '-m',
            'vit_jax.main', *LONG, f'--workdir={workdir}', f'--config.data_dir={data_dir}']
  job = _submitted(launch(*submit))
  _wait_for('the job to start', lambda: f'== job {job}, restart 0' in _text(log))
  status = launch('--status', '--lines=100')
  assert status.returncode == 0, status.stderr
  assert status.stdout.startswith(f'job {job}: RUNNING, '), status.stdout
  assert ' of 2:00, 1 node (localhost)\n' in status.stdout, status.stdout
  assert f'== {log}\n== job {job}, restart 0: 2 tasks on localhost' in status.stdout
  refused = launch(*submit)  # a second job from the same launch directory, while it runs
  assert refused.returncode == 2 and refused.stderr.startswith(
      f'error: job {job} launched from {launch_dir} is RUNNING: stop it first'), refused.stderr

  # The time limit: a save, the requeue, the resume. Once saved, the job gets 10 minutes more,
  # so that no second warning meets the steps below.
  _wait_for('a save at the time limit', lambda: _saves(_text(log)), timeout_s=900,
            about=lambda: _text(log))
  cluster.run(['scontrol', 'update', f'JobId={job}', 'TimeLimit=10'])
  _wait_for('the requeued job resuming from it',
            lambda: _resumed_after_requeue(_text(log), job, workdir) is not None, timeout_s=600,
            about=lambda: _text(log))
  saved_at = _resumed_after_requeue(_text(log), job, workdir)
  assert '== SIGTERM from SLURM: the tasks save a checkpoint and stop' in _text(log)
  assert 'on 2 processes x 1 x cpu' in _text(log)
  reference = uninterrupted(saved_at)  # the steps until then, run without a stop

  # --stop: SIGTERM to the tasks only: the trainer saves, the job ends, no requeue.
  _wait_for(f'step {saved_at + 2}', lambda: _last_step(workdir) >= saved_at + 2, timeout_s=900,
            about=lambda: _text(log))
  stop = launch('--stop')
  assert stop.returncode == 0, stop.stderr
  assert stop.stdout.splitlines() == [
      f'sent SIGTERM to the tasks of job {job}: the trainer saves a checkpoint and exits',
      f'stopped job {job} (COMPLETED)'], stop.stdout
  stopped_at = _saves(_text(log))[-1]
  assert stopped_at == _last_step(workdir) > saved_at
  assert '== requeueing' not in _text(log).rsplit('preempted: saved', 1)[1]
  after = launch('--status').stdout
  assert after.startswith(f'job {job}: COMPLETED, ') and ' of 10:00, ' in after, after
  restarts = re.search(r'Restarts=(\d+)', cluster.run(['scontrol', 'show', 'job', job]).stdout)
  assert restarts and int(restarts.group(1)) >= 1

  # The same launch command again: a new job resumes where the first stopped.
  second = _submitted(launch(*submit))
  assert second != job
  cluster.run(['scontrol', 'update', f'JobId={second}', 'TimeLimit=10'])  # no warning this time
  _wait_for(f'step {stopped_at + 2}', lambda: _last_step(workdir) >= stopped_at + 2,
            timeout_s=900, about=lambda: _text(log))
  assert launch('--stop').returncode == 0
  assert f'resumed from {workdir}/checkpoints at step {stopped_at}\n' in _text(log).split(
      f'== job {second}, restart 0')[1]
  assert 'preempted: saved the checkpoint of step ' in launch('--logs', '--lines=5').stdout
  _assert_equal_runs(workdir, reference, saved_at)


@pytest.mark.slow
def test_a_cancelled_job_is_not_requeued(cluster, task_env, tmp_path):
  """scancel sends SIGTERM to the batch shell too, as the time-limit warning does: the shell
  finds the job no longer RUNNING and lets it end."""
  launch_dir = tmp_path / 'launch'
  log = launch_dir / 'log.txt'
  job = _submitted(_launcher(task_env, launch_dir)('--', 'sleep', '300'))
  _wait_for('the job to start', lambda: f'== job {job}, restart 0' in _text(log))  # trap set
  cluster.run(['scancel', job])
  _wait_for('the batch shell to see the cancel', lambda: 'is cancelled' in _text(log),
            about=lambda: _text(log))
  time.sleep(8)  # longer than this cluster holds a requeued job back
  assert _state(cluster, job) == 'CANCELLED', _text(log)
  assert '== requeueing' not in _text(log)
  assert f'== SIGTERM: job {job} is cancelled; it is not requeued' in _text(log)


def test_srun_tasks_that_disagree_on_their_workdir_stop_with_one_line_and_write_nothing(
    cluster, task_env, tmp_path, data_dir):
  """Each of srun's 2 tasks given its own --workdir ($SLURM_PROCID in the flag): both stop where
  the processes first meet, with the same one line naming the difference, and neither writes."""
  command = ' '.join([sys.executable, '-m', 'vit_jax.main', *_config(2, checkpoint_every=2),
                      f'--config.data_dir={data_dir}', f'--workdir={tmp_path}/w$SLURM_PROCID'])
  proc = subprocess.run(['srun', '--ntasks=2', 'bash', '-c', command], cwd=ROOT, env=task_env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0, proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 2 and errors[0] == errors[1], proc.stderr
  assert errors[0].startswith(f'error: the processes of this run disagree: --workdir is '
                              f'{tmp_path}/w0 on process 0 but {tmp_path}/w1 on process 1'), errors
  assert 'Traceback' not in proc.stderr, proc.stderr
  assert not os.path.exists(tmp_path / 'w0') and not os.path.exists(tmp_path / 'w1')
