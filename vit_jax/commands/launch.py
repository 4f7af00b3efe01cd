"""Run one command on every worker of a Cloud TPU VM: `python -m vit_jax launch --tpu=NAME ...`.

  python -m vit_jax launch --tpu=my-v3-32 --zone=europe-west4-a --sync --setup -- \
      python3 -m vit_jax.main --config=configs/pretrain.py:model=B/16 --workdir=gs://bucket/run
  python -m vit_jax launch --tpu=my-v3-32 --zone=europe-west4-a --status   (or --logs, --stop)

--sync ships the checkout's tracked files (git ls-files) and replaces --repo_dir on each worker;
--setup installs the pinned requirements.lock and the libtpu of requirements-tpu.lock into a Python
3.11 venv made by uv (--launch_dir/venv; the TPU images' Python 3.10 is fine to start from); the
command after -- starts detached on every worker with that venv first on PATH (pid and log.txt in
--launch_dir); --status says whether it is alive on each worker with its last --lines log lines;
--logs prints them; --stop ends it on every worker (SIGTERM, SIGKILL after --stop_timeout s).
--dry_run prints the gcloud commands.
The logic is in vit_jax/launch/.
"""

import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_TPU = flags.DEFINE_string('tpu', None, 'Name of the Cloud TPU VM (node) to run on.')
_ZONE = flags.DEFINE_string('zone', None, 'Its zone, e.g. europe-west4-a.')
_PROJECT = flags.DEFINE_string('project', None, 'Google Cloud project (default: gcloud config).')
_REPO = flags.DEFINE_string('repo_dir', '~/vit_jax', 'Where the code lives on each worker.')
_LAUNCH_DIR = flags.DEFINE_string('launch_dir', '~/vit_jax_launch',
                                  "The run's pid and log.txt on each worker (outside the code).")
_PYTHON = flags.DEFINE_string('python', 'python3', "The worker's Python whose pip installs uv for "
                              '--setup (any version); the venv uv makes has Python 3.11.')
_SYNC = flags.DEFINE_bool('sync', False, "First ship this checkout's tracked files to --repo_dir.")
_SETUP = flags.DEFINE_bool('setup', False, 'Then install the pinned locks into a Python 3.11 venv '
                           '(<launch_dir>/venv, first on PATH for the command) on every worker.')
_STATUS = flags.DEFINE_bool('status', False, 'Is the run alive on each worker (last log lines).')
_LOGS = flags.DEFINE_bool('logs', False, "Print the last --lines of each worker's log.")
_STOP = flags.DEFINE_bool('stop', False, 'End the launched run on every worker.')
_LINES = flags.DEFINE_integer('lines', 20, 'Log lines shown by --status / --logs.')
_STOP_TIMEOUT = flags.DEFINE_integer('stop_timeout', 60, 'Seconds from SIGTERM to SIGKILL.')
_DRY_RUN = flag_groups.dry_run()


def run(argv) -> int:
  from vit_jax import launch  # pylint: disable=g-import-not-at-top
  plan = launch.Plan(_TPU.value, _ZONE.value, _PROJECT.value, _REPO.value, _LAUNCH_DIR.value,
                     _PYTHON.value, uv=launch.uv_pin() if _SETUP.value else 'uv')
  steps = launch.Steps(sync=_SYNC.value, setup=_SETUP.value, command=argv[1:],
                       status=_STATUS.value, logs=_LOGS.value, stop=_STOP.value,
                       lines=_LINES.value, stop_timeout=_STOP_TIMEOUT.value)
  launch.run(plan, steps, dry_run=_DRY_RUN.value, say=lambda line: print(line, flush=True))
  return 0


# The flags that take a value, which may follow them as the next argument (`--tpu NAME`).
_VALUED = frozenset({'tpu', 'zone', 'project', 'repo_dir', 'launch_dir', 'python', 'lines',
                     'stop_timeout'})


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
  flag_groups.adapt('dry_run', help='Print the gcloud commands instead of running.')
  word = command_without_separator(sys.argv[1:])
  if word is not None and not cli.asks_for_help(sys.argv):
    cli.fail(f'{word!r} is not a flag of launch: put the command to run after --, e.g. python -m '
             f'vit_jax launch --tpu=NAME --zone=ZONE -- {word} ...')
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
