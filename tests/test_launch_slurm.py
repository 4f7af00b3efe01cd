"""The SLURM launcher's batch script, sbatch options and answers (pure), and its command line with
stand-ins for SLURM's tools: a missing or failing tool is one `error:` line. tests/test_slurm.py
runs it on a real SLURM."""

import os
import shlex
import subprocess
import sys

import pytest

from vit_jax.errors import UserError
from vit_jax.tools.launch import Steps, slurm
from helpers import ROOT

TRAIN = ['python', '-m', 'vit_jax.main', '--config=configs/default.py:steps=5',
         '--workdir=/shared/runs/one run']


def _place(tmp_path, venv='/opt/venv'):
  return slurm.Place(str(tmp_path / 'launch'), '/shared/vit_jax', venv)


def test_gpu_job_script_runs_one_task_per_gpu_under_srun_and_requeues_after_the_warning(tmp_path):
  job = slurm.Job(nodes=4, gpus_per_node=8, cpus_per_task=12, partition='gpu', account='lab',
                  time='24:00:00', qos='high', signal_lead=300, options=('--constraint=h100',))
  place = _place(tmp_path)
  script = slurm.batch_script(job, place, TRAIN)
  launch = tmp_path / 'launch'
  assert [l for l in script.splitlines() if l.startswith('#SBATCH')] == [
      '#SBATCH --job-name=vit_jax', '#SBATCH --nodes=4', '#SBATCH --ntasks-per-node=8',
      '#SBATCH --gpus-per-node=8', '#SBATCH --cpus-per-task=12', '#SBATCH --partition=gpu',
      '#SBATCH --account=lab', '#SBATCH --time=24:00:00', '#SBATCH --qos=high',
      '#SBATCH --signal=B:TERM@300', '#SBATCH --requeue', f'#SBATCH --output={launch}/log.txt',
      '#SBATCH --open-mode=append', '#SBATCH --chdir=/shared/vit_jax',
      '#SBATCH --constraint=h100']
  assert 'export PATH=/opt/venv/bin:"$PATH"' in script
  assert 'export SRUN_CPUS_PER_TASK=12' in script
  assert f'srun --kill-on-bad-exit=1 {shlex.join(TRAIN)} &' in script
  assert "'--workdir=/shared/runs/one run'" in script  # quoted for the shell
  # The warning goes to the tasks (not to srun, which would kill them), then the job requeues.
  assert 'trap warn TERM' in script and 'scancel --signal=TERM "$SLURM_JOB_ID"' in script
  assert 'scontrol requeue "$SLURM_JOB_ID"' in script
  assert subprocess.run(['bash', '-n'], input=script, text=True).returncode == 0


def test_cpu_job_runs_one_task_per_node_and_a_zero_lead_asks_for_no_warning(tmp_path):
  options = slurm.directives(slurm.Job(nodes=2, signal_lead=0), _place(tmp_path))
  assert '--ntasks-per-node=1' in options
  assert not [o for o in options if o.startswith(('--gpus', '--signal', '--time'))]
  assert slurm.Job(tasks_per_node=2).tasks == 2 and slurm.Job(gpus_per_node=4).tasks == 4
  script = slurm.batch_script(slurm.Job(), _place(tmp_path, venv=None), TRAIN)
  assert 'export PATH' not in script and 'SRUN_CPUS_PER_TASK' not in script


@pytest.mark.parametrize('kwargs, needle', [
    (dict(nodes=0), '--nodes=0: it must be at least 1'),
    (dict(gpus_per_node=-1), '--gpus_per_node=-1: it must be at least 0'),
    (dict(tasks_per_node=0), '--tasks_per_node=0: it must be at least 1'),
    (dict(signal_lead=-5), '--signal_lead=-5: it must be at least 0'),
    (dict(partition='gpu a100'), "--partition='gpu a100': give one word without blanks"),
    (dict(name=''), "--job_name='': give one word"),
    (dict(options=('constraint=a100',)), "--sbatch_option='constraint=a100' is not an sbatch"),
    (dict(gpus_per_node=8, tasks_per_node=1), '--tasks_per_node=1 with --gpus_per_node=8: under '
                                              'srun each JAX process takes the one GPU'),
])
def test_bad_job_arguments(kwargs, needle):
  with pytest.raises(UserError, match=needle):
    slurm.Job(**kwargs)


def test_no_command_and_nothing_to_do(tmp_path):
  with pytest.raises(UserError, match='no command to run: put it after --'):
    slurm.batch_script(slurm.Job(), _place(tmp_path), [])
  with pytest.raises(UserError, match='pass --status, --logs or --stop'):
    slurm.run(slurm.Job(), _place(tmp_path), Steps())
  with pytest.raises(UserError, match='--sync and --setup are for Cloud TPU VMs'):
    slurm.run(slurm.Job(), _place(tmp_path), Steps(setup=True, command=TRAIN))


def test_squeue_and_sacct_answers_in_words():
  running = slurm.parse_squeue('RUNNING|None|1:02|2:00|2|node[01-02]\n')
  assert (running.name, running.line) == ('RUNNING', 'RUNNING, 1:02 of 2:00, 2 nodes (node[01-02])')
  assert not running.finished and not running.waiting
  pending = slurm.parse_squeue('PENDING|BeginTime|0:00|2:00|1|\n')
  assert pending.line == 'PENDING (BeginTime), 0:00 of 2:00' and pending.waiting
  assert slurm.parse_squeue('COMPLETED|None|0:42|UNLIMITED|1|n1\n').finished
  assert slurm.parse_squeue('') is None
  ended = slurm.parse_sacct('CANCELLED by 0|00:01:05|00:02:00|1|n1\n')
  assert ended.name == 'CANCELLED' and ended.finished
  assert ended.line == 'CANCELLED by 0, 00:01:05 of 00:02:00, 1 node(s) (n1) (sacct)'


def _tools(tmp_path, **scripts):
  """A PATH directory with a stand-in for each tool: name -> shell script body."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  for name, body in scripts.items():
    (bin_dir / name).write_text(f'#!/bin/sh\n{body}\n')
    os.chmod(bin_dir / name, 0o755)
  return str(bin_dir)


def _launch(tmp_path, *args, path):
  env = dict(os.environ, PATH=path)
  return subprocess.run([sys.executable, '-m', 'vit_jax', 'launch', '--slurm',
                         f'--launch_dir={tmp_path}/launch', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def _one_error_line(proc) -> str:
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
  return lines[0]


@pytest.mark.slow
def test_cli_dry_run_prints_the_script_and_commands_and_writes_nothing(tmp_path):
  proc = _launch(tmp_path, '--nodes=2', '--gpus_per_node=8', '--time=1:00:00', '--dry_run',
                 '--stop', '--', *TRAIN, path=os.environ['PATH'])
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout.splitlines()
  launch = tmp_path / 'launch'
  assert out[:3] == ['squeue --noheader --states=all --jobs=JOBID \'--format=%T|%r|%M|%l|%D|%N\'',
                     'scancel --signal=TERM JOBID   # running: the trainer saves and exits',
                     'scancel JOBID   # not started, or still running 60 s after SIGTERM']
  assert out[3] == f'# {launch}/job.sbatch:' and out[4] == '#!/bin/bash'
  assert '#SBATCH --gpus-per-node=8' in out and f'#SBATCH --chdir={ROOT}' in out
  assert f'export PATH={sys.prefix}/bin:"$PATH"' in out  # the venv running launch
  assert out[-2:] == [f'mkdir -p {launch}', f'sbatch --parsable {launch}/job.sbatch > {launch}/job']
  assert not launch.exists()


@pytest.mark.slow
def test_cli_errors_of_slurm_tools_are_one_line(tmp_path):
  python_only = _tools(tmp_path)  # no SLURM tools on PATH
  line = _one_error_line(_launch(tmp_path, '--', *TRAIN,
                                 path=f'{python_only}:/nonexistent'))
  assert line.startswith('error: sbatch is not installed here: this is not a SLURM login node')
  path = _tools(tmp_path, sbatch='echo "sbatch: error: Batch job submission failed: Invalid '
                'partition name specified" >&2; exit 1',
                squeue='echo "squeue: error: Unable to contact slurm controller (connect '
                'failure)" >&2; exit 1')
  line = _one_error_line(_launch(tmp_path, '--partition=nope', '--', *TRAIN, path=path))
  assert line == ('error: sbatch --parsable ' + f'{tmp_path}/launch/job.sbatch failed with exit '
                  'status 1 (sbatch: error: Batch job submission failed: Invalid partition name '
                  'specified)')
  (tmp_path / 'launch' / 'job').write_text('41\n')
  line = _one_error_line(_launch(tmp_path, '--status', path=path))
  assert line == ('error: squeue --noheader --states=all --jobs=41 --format=%T|%r|%M|%l|%D|%N '
                  'failed with exit status 1 (squeue: error: Unable to contact slurm controller '
                  '(connect failure))')
  # A job that is still alive is not launched over.
  path = _tools(tmp_path, squeue='echo "RUNNING|None|0:10|2:00|1|n1"')
  line = _one_error_line(_launch(tmp_path, '--', *TRAIN, path=path))
  assert line == (f'error: job 41 launched from {tmp_path}/launch is RUNNING: stop it first '
                  '(launch --slurm --stop), or pass another --launch_dir')


@pytest.mark.slow
@pytest.mark.parametrize('args, needle', [
    (['--slurm', '--zone=z', '--status'], 'error: --zone is a flag of the Cloud TPU launcher'),
    (['--nodes=2', '--status'], 'error: --nodes is a flag of launch --slurm: add --slurm'),
    (['--slurm', '--stop', '--status'], 'error: --stop with --status: --stop ends the job'),
])
def test_cli_mixed_flags(args, needle):
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'launch', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert _one_error_line(proc).startswith(needle), proc.stderr


@pytest.mark.slow
def test_cli_stop_cancels_a_job_that_has_not_started_or_was_requeued_meanwhile(tmp_path):
  """--stop against stand-ins: squeue answers from a list of states (one per call, the last one
  repeating), scancel records its arguments."""
  calls = tmp_path / 'scancel.txt'
  path = _tools(tmp_path, squeue=f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); '
                f'echo $((n + 1)) > {tmp_path}/n; '
                f'sed -n "$((n + 1))p;\\$p" {tmp_path}/states | head -1',
                scancel=f'echo "$*" >> {calls}')
  (tmp_path / 'launch').mkdir()
  (tmp_path / 'launch' / 'job').write_text('41\n')

  def stop(*states):
    (tmp_path / 'states').write_text(''.join(f'{s}|None|0:10|2:00|1|n1\n' for s in states))
    (tmp_path / 'n').unlink(missing_ok=True)
    calls.write_text('')
    proc = _launch(tmp_path, '--stop', path=f'{path}:/usr/bin:/bin')  # the stand-ins first
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines(), calls.read_text().splitlines()

  assert stop('PENDING') == (['cancelled job 41 (PENDING: it had not started)'], ['41'])
  assert stop('RUNNING', 'RUNNING', 'PENDING') == (
      ['sent SIGTERM to the tasks of job 41: the trainer saves a checkpoint and exits',
       'stopped job 41 (requeued meanwhile, now cancelled)'], ['--signal=TERM 41', '41'])
  assert stop('RUNNING', 'COMPLETED') == (
      ['sent SIGTERM to the tasks of job 41: the trainer saves a checkpoint and exits',
       'stopped job 41 (COMPLETED)'], ['--signal=TERM 41'])
  assert stop('TIMEOUT') == (['job 41 is not running (TIMEOUT, 0:10 of 2:00, 1 node (n1))'], [])
