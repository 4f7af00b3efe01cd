"""Run one command on every worker of a Cloud TPU VM: `python -m vit_jax launch --tpu=NAME ...`.

  python -m vit_jax launch --tpu=my-v3-32 --zone=europe-west4-a [--sync] [--setup] \
      [--log=train.log] [--dry_run] -- \
      python3 -m vit_jax.main --config=configs/pretrain.py:model=B/16 --workdir=gs://bucket/run

Multi-host JAX needs the SAME command started on EVERY worker (a run started on one worker waits
for the others, then fails after --distributed_timeout). This builds the `gcloud compute tpus
tpu-vm ssh NAME --zone=Z --worker=all --command=...` invocation (plus `scp` for --sync and a pip
install for --setup) and runs them in order; --dry_run prints them instead. On the workers,
`vit_jax.main` detects the TPU slice and joins the distributed runtime by itself.

Commands are argument lists (never a local shell); the remote part is quoted with shlex.
"""

import shlex
import subprocess
import sys
from typing import List, Optional, Sequence

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups
from vit_jax.errors import UserError

_TPU = flags.DEFINE_string('tpu', None, 'Name of the Cloud TPU VM (node) to run on.')
_ZONE = flags.DEFINE_string('zone', None, 'Its zone, e.g. europe-west4-a.')
_PROJECT = flags.DEFINE_string('project', None, 'Google Cloud project (default: gcloud config).')
_REPO = flags.DEFINE_string('repo_dir', '~/vit_jax', 'Where the code lives on each worker.')
_SYNC = flags.DEFINE_bool('sync', False, 'First copy this checkout to --repo_dir on every worker.')
_SETUP = flags.DEFINE_bool('setup', False, "First pip-install '.[tpu]' on every worker.")
_LOG = flags.DEFINE_string('log', None, 'Detach the command (nohup) and write its output to this '
                           'file on each worker, so a dropped ssh session does not kill it.')
_DRY_RUN = flag_groups.dry_run()


def build_commands(*, tpu: str, zone: str, command: Sequence[str], project: Optional[str] = None,
                   repo_dir: str = '~/vit_jax', sync: bool = False, setup: bool = False,
                   log: Optional[str] = None, local_dir: str = '.') -> List[List[str]]:
  """The gcloud argument lists that put `command` on every worker of `tpu` (pure function)."""
  if not tpu or not zone:
    raise UserError('pass --tpu=NAME and --zone=ZONE of the Cloud TPU VM')
  if not command:
    raise UserError('no command to run: put it after --, e.g. -- python3 -m vit_jax.main '
                    '--config=... --workdir=gs://bucket/run')
  where = [f'--zone={zone}'] + ([f'--project={project}'] if project else [])
  ssh = ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', tpu, *where, '--worker=all']
  # `~` must stay unquoted to expand on the worker; the rest of the path is quoted.
  cd = f'cd {_remote_path(repo_dir)}'
  commands = []
  if sync:
    commands.append(['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', '--recurse', local_dir,
                     f'{tpu}:{repo_dir}', *where, '--worker=all'])
  if setup:
    commands.append(ssh + [f"--command={cd} && python3 -m pip install --quiet -e '.[tpu]'"])
  run = shlex.join(command)
  if log:
    run = f'nohup {run} > {shlex.quote(log)} 2>&1 < /dev/null &'
  commands.append(ssh + [f'--command={cd} && {run}'])
  return commands


def _remote_path(path: str) -> str:
  if path == '~' or path.startswith('~/'):
    rest = path[2:]
    return '~' + (f'/{shlex.quote(rest)}' if rest else '')
  return shlex.quote(path)


def run(argv) -> int:
  commands = build_commands(tpu=_TPU.value, zone=_ZONE.value, command=argv[1:],
                            project=_PROJECT.value, repo_dir=_REPO.value, sync=_SYNC.value,
                            setup=_SETUP.value, log=_LOG.value)
  for command in commands:
    print(shlex.join(command), flush=True)
    if not _DRY_RUN.value:
      try:
        result = subprocess.run(command, check=False)
      except FileNotFoundError:
        raise UserError('gcloud is not installed here: install the Google Cloud CLI, or use '
                        '--dry_run and run the printed commands elsewhere') from None
      if result.returncode:
        raise UserError(f'{" ".join(command[:5])} ... failed with exit status '
                        f'{result.returncode}; see its output above')
  return 0


def main():
  flag_groups.adapt('dry_run', help='Print the gcloud commands instead of running.')
  cli.run_main(run)


if __name__ == '__main__':
  sys.exit(main())
