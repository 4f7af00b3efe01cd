"""Hyperparameter sweeps: `python -m vit_jax sweep --sweep=experiments/<name>/sweep.py --workdir=DIR`.

Works through the spec's runs as an Optuna study (a grid, or ranges sampled by TPE), each run in
DIR/grid/<name> (runs finished before are skipped, so a killed sweep resumes; a pruner may stop
runs that are behind), picks the best setting (on the dev split when the spec asks, as the paper
chose its learning rates), reruns it for the final numbers, and writes results.csv, results.md,
<metric>_vs_<x>.png and best.json to DIR. --dry_run prints the commands on stdout (other plan
lines as `# ` comments, so the output runs as a shell script).

The study lives in DIR/study.db (one sweep process per directory) unless --storage names a
database: then the same command, started on any number of machines, shares the work (a trial
whose worker dies is retried by another, resuming its checkpoint in DIR/grid/<name>).
"""

import shlex
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_SWEEP = flags.DEFINE_string('sweep', None, 'Sweep spec file (a get_sweep() function).')
_WORKDIR = flag_groups.workdir()
_DRY_RUN = flag_groups.dry_run()
_LAUNCHER = flags.DEFINE_enum('launcher', 'process', ['process', 'inline'],
                              'process: each run in its own python; inline: in this process.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at once (launcher=process).')
_STORAGE = flags.DEFINE_string(
    'storage', None, 'Database URL of the study that several workers share, e.g. '
    'postgresql://user:password@host:5432/db (default: DIR/study.db, this process only).')
_STUDY_NAME = flags.DEFINE_string('study_name', None,
                                  'Name of the study in --storage (default: the workdir).')
_HEARTBEAT = flags.DEFINE_integer(
    'heartbeat', 60, 'Seconds between a running trial\'s heartbeats; a trial silent for twice '
    'this long is retried by another worker.')


def run(argv) -> int:
  del argv
  from vit_jax.tools import sweeps  # pylint: disable=g-import-not-at-top
  if not _WORKDIR.value:
    raise cli.UserError('missing --workdir: pass --workdir=DIR for the sweep')
  say = plan_line if _DRY_RUN.value else (
      lambda message: print(message, file=sys.stderr, flush=True))
  summary = sweeps.run_sweep(_SWEEP.value, _WORKDIR.value, launcher=_LAUNCHER.value,
                             parallel=_PARALLEL.value, dry_run=_DRY_RUN.value, say=say,
                             storage=_STORAGE.value, study_name=_STUDY_NAME.value,
                             heartbeat_s=_HEARTBEAT.value)
  if _DRY_RUN.value:
    return 0
  if 'stopped' in summary:
    say(f'stopped: {len(summary["stopped"])} run(s) stopped or not started '
        f'({", ".join(summary["stopped"][:4])}{", ..." if len(summary["stopped"]) > 4 else ""}); '
        'the started ones saved a checkpoint: rerun the same command to resume the sweep')
    return 0
  print(summary['table'], end='')
  print(f'plot: {summary["plot"]}')
  if summary['failed']:
    raise cli.UserError(f'{len(summary["failed"])} run(s) failed: {", ".join(summary["failed"])};'
                        f' see their log.txt, fix, and rerun the same command to retry them')
  return 0


def plan_line(message: str) -> None:
  """A dry run's line on stdout: a run's command as is, any other line as a shell comment."""
  command = message.startswith(shlex.quote(sys.executable) + ' ')
  print(message if command else f'# {message}', flush=True)


def main():
  flag_groups.adapt('workdir', help='Directory of the sweep (one sub-workdir per run).')
  flag_groups.adapt('dry_run', help='Print the commands of the runs left to do.')
  cli.run_main(run, required_flags=('sweep',))


if __name__ == '__main__':
  sys.exit(main())
