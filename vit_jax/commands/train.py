"""Train or fine-tune: `python -m vit_jax train --config=configs/default.py --workdir=DIR`.

`python -m vit_jax.main ...` (the original's entry point) is the same command.

Overrides: `--config.lr=3e-4 --config.model_name=ViT-S/16`; config arguments after the file name:
`--config=configs/default.py:steps=100`. Rerunning with the same workdir resumes.
Multi-host: run the same command on every host with --coordinator_address (process 0's HOST:PORT),
--num_processes and --process_id; on a Cloud TPU VM slice they are detected when absent. If the
processes do not all arrive within --distributed_timeout seconds, every one fails with one line.
"""

import signal
import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_CONFIG = flag_groups.config()
_WORKDIR = flag_groups.workdir()
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'HOST:PORT of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes (hosts).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process index.')
_ALLOW_CHANGE = flags.DEFINE_bool(
    'allow_config_change', False,
    'Resume a workdir even though its checkpoint was trained with another config.')
_TIMEOUT = flags.DEFINE_integer('distributed_timeout', 300,
                                'Seconds to wait for all processes to join the distributed run.')


def run(argv) -> int:
  del argv
  # Every mistake of a flag, the config or a path is said before JAX, TensorFlow or orbax loads.
  # pylint: disable-next=g-import-not-at-top
  from vit_jax.run import guards, lock
  from vit_jax.train import validate
  config = _CONFIG.value
  guards.stop_with_parent()  # started by a sweep: its death stops this run (with a checkpoint)
  if not _WORKDIR.value:
    raise cli.UserError('missing --workdir: pass --workdir=DIR (checkpoints and logs go there)')
  info = data_facts(config)
  checked = validate.check_config(config)  # the one validation: before joining a distributed run
  lock.check_free(_WORKDIR.value)  # a workdir another run holds: stop before building anything
  # JAX and the trainer load here (TensorFlow only once the input pipeline is built).
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop, program  # pylint: disable=g-import-not-at-top
  parallel.init_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                            timeout_s=_TIMEOUT.value)
  # Every process of the run on the same workdir, config and command line, before any writes.
  parallel.check_agreement(parallel.run_record(_WORKDIR.value, config.to_dict(), sys.argv[1:]),
                           timeout_s=_TIMEOUT.value)
  prog = program.build_program(config, checked=checked, info=info)  # the mesh and model, once
  result = loop.train_and_evaluate(config, _WORKDIR.value, program=prog,
                                   allow_config_change=_ALLOW_CHANGE.value)
  if result.get('preempted'):  # saved and said so: a Ctrl-C from now on changes nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)
  if config.compile_only or config.compile_for or result.get('preempted'):
    return 0
  print(f'final {config.eval_split} {checked.task.metric_name}: '
        f'{result["accuracy"]:.4f} ({int(result["count"])} examples)')
  return 0


def data_facts(config):
  """The dataset's info (`data.get_info`), looked up before JAX loads so that a missing dataset or
  data_dir is said at once; None where the run needs no dataset (compile-only)."""
  if config.compile_only or config.compile_for:
    return None
  from vit_jax import data  # pylint: disable=g-import-not-at-top  # no TensorFlow, no JAX
  return data.get_info(config.dataset, config.data_dir)


def main():
  flag_groups.adapt('workdir', help='Directory for checkpoints and logs.')
  cli.run_main(run, required_flags=('config',))


if __name__ == '__main__':
  sys.exit(main())
