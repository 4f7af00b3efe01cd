"""Run one command on every worker of a Cloud TPU VM, or as a SLURM job: `python -m vit_jax launch`.

  python -m vit_jax launch --tpu=my-v3-32 --zone=europe-west4-a --sync --setup -- \
      python3 -m vit_jax.main --config=configs/pretrain.py:model=B/16 --workdir=gs://bucket/run
  python -m vit_jax launch --tpu=my-v3-32 --zone=europe-west4-a --status   (or --logs, --stop)
  python -m vit_jax launch --slurm --nodes=2 --gpus_per_node=8 --time=24:00:00 -- \
      python -m vit_jax.main --config=configs/pretrain.py:model=B/16 --workdir=/shared/runs/b16
  python -m vit_jax launch --slurm --status   (or --logs, --stop)

Cloud TPU VM (--tpu, --zone): --sync ships the checkout's tracked files (git ls-files) and
replaces --repo_dir on each worker; --setup installs the pinned requirements.lock and the libtpu of
requirements-tpu.lock into a Python 3.11 venv made by uv (--launch_dir/venv; the TPU images'
Python 3.10 is fine to start from); the command after -- starts detached on every worker with that
venv first on PATH (pid and log.txt in --launch_dir); --status says whether it is alive on each
worker with its last --lines log lines; --logs prints them; --stop ends it on every worker
(SIGTERM, SIGKILL after --stop_timeout s).

SLURM (--slurm, on a login node; the checkout, its .venv and the workdir on storage every node
sees): the command after -- runs under srun as one task per GPU (--gpus_per_node) or per node,
from this directory with this venv's python first on PATH; the batch script, the job id and the
log are in --launch_dir. SLURM warns the job --signal_lead seconds before its --time limit: the
trainer saves a checkpoint and the job is requeued to resume from it. --status shows the job's
state and the log's last --lines; --logs prints them; --stop sends SIGTERM to the tasks (the
trainer saves and exits), and cancels the job after --stop_timeout s if it still runs.
--dry_run prints the commands (and the batch script) instead.
The logic is in vit_jax/tools/launch/.
"""

import os
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_TPU = flags.DEFINE_string('tpu', None, 'Name of the Cloud TPU VM (node) to run on.')
_ZONE = flags.DEFINE_string('zone', None, 'Its zone, e.g. europe-west4-a.')
_PROJECT = flags.DEFINE_string('project', None, 'Google Cloud project (default: gcloud config).')
_REPO = flags.DEFINE_string('repo_dir', '~/vit_jax', 'Where the code lives on each worker.')
_LAUNCH_DIR = flags.DEFINE_string(
    'launch_dir', '~/vit_jax_launch', "The run's pid and log.txt on each TPU worker (outside the "
    'code); with --slurm, the job script, id and log.txt here (on storage the nodes share).')
_PYTHON = flags.DEFINE_string('python', 'python3', "The worker's Python whose pip installs uv for "
                              '--setup (any version); the venv uv makes has Python 3.11.')
_SYNC = flags.DEFINE_bool('sync', False, "First ship this checkout's tracked files to --repo_dir.")
_SETUP = flags.DEFINE_bool('setup', False, 'Then install the pinned locks into a Python 3.11 venv '
                           '(<launch_dir>/venv, first on PATH for the command) on every worker.')
_STATUS = flags.DEFINE_bool('status', False, 'Is the run alive on each worker / the state of the '
                            'SLURM job (last log lines).')
_LOGS = flags.DEFINE_bool('logs', False, "Print the last --lines of each worker's (the job's) log.")
_STOP = flags.DEFINE_bool('stop', False, 'End the launched run (SIGTERM: the trainer saves).')
_LINES = flags.DEFINE_integer('lines', 20, 'Log lines shown by --status / --logs.')
_STOP_TIMEOUT = flags.DEFINE_integer('stop_timeout', 60, 'Seconds from SIGTERM to SIGKILL '
                                     '(with --slurm: to scancel).')
_DRY_RUN = flag_groups.dry_run()
# SLURM.
_SLURM = flags.DEFINE_bool('slurm', False, 'Run the command as a SLURM batch job (sbatch).')
_NODES = flags.DEFINE_integer('nodes', 1, 'SLURM: nodes of the job.')
_GPUS = flags.DEFINE_integer('gpus_per_node', 0, 'SLURM: GPUs per node (one task each).')
_TASKS = flags.DEFINE_integer('tasks_per_node', None, 'SLURM: tasks (processes) per node; '
                              'one per GPU (the only count taken with GPUs), or 1 without GPUs.')
_CPUS = flags.DEFINE_integer('cpus_per_task', None, 'SLURM: CPUs per task (input pipeline).')
_PARTITION = flags.DEFINE_string('partition', None, 'SLURM: partition (default: the cluster\'s).')
_ACCOUNT = flags.DEFINE_string('account', None, 'SLURM: account to charge.')
_TIME = flags.DEFINE_string('time', None, 'SLURM: time limit of each run of the job (e.g. '
                            '24:00:00); the job is requeued when it is reached.')
_QOS = flags.DEFINE_string('qos', None, 'SLURM: quality of service.')
_JOB_NAME = flags.DEFINE_string('job_name', 'vit_jax', 'SLURM: job name.')
_SIGNAL_LEAD = flags.DEFINE_integer(
    'signal_lead', 120, 'SLURM: seconds before the time limit at which the trainer is told to save '
    '(SLURM acts on it within a minute of that point); 0: no warning, no requeue.')
_SBATCH_OPTION = flags.DEFINE_multi_string('sbatch_option', [], 'SLURM: one more sbatch option '
                                           'for the script (repeatable), e.g. --constraint=a100.')
_VENV = flags.DEFINE_string('venv', None, "SLURM: the venv whose python runs the command (default: "
                            'the one running launch, e.g. .venv of `make install`).')

TPU_ONLY = ('tpu', 'zone', 'project', 'repo_dir', 'python', 'sync', 'setup')
SLURM_ONLY = ('nodes', 'gpus_per_node', 'tasks_per_node', 'cpus_per_task', 'partition', 'account',
              'time', 'qos', 'job_name', 'signal_lead', 'sbatch_option', 'venv')


def _given(names) -> list:
  return [f'--{n}' for n in names if flags.FLAGS[n].present]


def run(argv) -> int:
  from vit_jax.tools import launch  # pylint: disable=g-import-not-at-top
  steps = launch.Steps(sync=_SYNC.value, setup=_SETUP.value, command=argv[1:],
                       status=_STATUS.value, logs=_LOGS.value, stop=_STOP.value,
                       lines=_LINES.value, stop_timeout=_STOP_TIMEOUT.value)
  say = lambda line: print(line, flush=True)  # pylint: disable=unnecessary-lambda-assignment
  if _SLURM.value:
    from vit_jax.tools.launch import slurm  # pylint: disable=g-import-not-at-top
    wrong = _given(TPU_ONLY)
    if wrong:
      raise cli.UserError(f'{wrong[0]} is a flag of the Cloud TPU launcher, not of --slurm: drop '
                          'it (on a SLURM cluster the nodes share the checkout)')
    job = slurm.Job(nodes=_NODES.value, gpus_per_node=_GPUS.value, tasks_per_node=_TASKS.value,
                    cpus_per_task=_CPUS.value, partition=_PARTITION.value,
                    account=_ACCOUNT.value, time=_TIME.value, qos=_QOS.value,
                    name=_JOB_NAME.value, signal_lead=_SIGNAL_LEAD.value,
                    options=tuple(_SBATCH_OPTION.value))
    place = slurm.Place(_LAUNCH_DIR.value, os.getcwd(), _VENV.value or slurm.current_venv())
    slurm.run(job, place, steps, dry_run=_DRY_RUN.value, say=say)
    return 0
  wrong = _given(SLURM_ONLY)
  if wrong:
    raise cli.UserError(f'{wrong[0]} is a flag of launch --slurm: add --slurm to run on a SLURM '
                        'cluster')
  plan = launch.Plan(_TPU.value, _ZONE.value, _PROJECT.value, _REPO.value, _LAUNCH_DIR.value,
                     _PYTHON.value, uv=launch.uv_pin() if _SETUP.value else 'uv')
  launch.run(plan, steps, dry_run=_DRY_RUN.value, say=say)
  return 0


# The flags that take a value, which may follow them as the next argument (`--tpu NAME`).
_VALUED = frozenset({'tpu', 'zone', 'project', 'repo_dir', 'launch_dir', 'python', 'lines',
                     'stop_timeout', 'nodes', 'gpus_per_node', 'tasks_per_node', 'cpus_per_task',
                     'partition', 'account', 'time', 'qos', 'job_name', 'signal_lead',
                     'sbatch_option', 'venv'})


def command_without_separator(args) -> str | None:
  """The first word of a command given without `--` before it (absl would read its `-m` as a
  flag of launch), or None."""
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == '--':
      return None
    if not arg.startswith('-'):
      return arg
    if '=' not in arg and arg.lstrip('-') in _VALUED:
      i += 1  # its value
    i += 1
  return None


def main():
  flag_groups.adapt('dry_run', help='Print the commands (gcloud, or the SLURM batch script and '
                    'sbatch) instead of running them.')
  word = command_without_separator(sys.argv[1:])
  if word is not None and not cli.asks_for_help(sys.argv):
    cli.fail(f'{word!r} is not a flag of launch: put the command to run after --, e.g. python -m '
             f'vit_jax launch --tpu=NAME --zone=ZONE -- {word} ...')
  cli.run_main(run, compilation_cache=False)  # launch compiles nothing: no JAX to import


if __name__ == '__main__':
  sys.exit(main())
