"""The device mesh ('data', 'fsdp', 'model') and the JAX distributed runtime."""

import dataclasses
import json
import os
import threading
from typing import Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType

from vit_jax.errors import UserError
from vit_jax.platform import chips

AXES = ('data', 'fsdp', 'model')
DEFAULT_TIMEOUT_S = 300
JAX_DEADLINE_MARGIN_S = 30  # JAX's own deadline comes this much after ours (see _initialize)
EXIT_USER_ERROR = 2  # as vit_jax.cli


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, model) sizes from the config; one of them may be -1 (= all remaining devices)."""
  sizes = [int(getattr(mesh_config, a, 1)) for a in AXES]
  flags = ', '.join(f'config.mesh.{a}={s}' for a, s in zip(AXES, sizes))
  if sum(s == -1 for s in sizes) > 1:
    raise UserError(f'mesh {flags}: at most one axis may be -1 (all remaining devices)')
  if any(s == 0 or s < -1 for s in sizes):
    raise UserError(f'mesh {flags}: sizes must be positive (or -1 for the rest)')
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise UserError(f'mesh {flags}: {known} does not divide the {num_devices} devices; '
                      f'pick sizes whose product divides {num_devices}')
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise UserError(f'mesh {flags} has {int(np.prod(sizes))} devices but there are '
                    f'{num_devices}: make the product {num_devices}, or set one axis to -1')
  return tuple(sizes)


def make_mesh(mesh_config, devices: Optional[Sequence[jax.Device]] = None) -> jax.sharding.Mesh:
  """The ('data', 'fsdp', 'model') mesh over `devices` (default: every device of every process).

  Axis types are Auto (the compiler propagates shardings from the constraints we give), laid out
  by `jax.make_mesh` for the physical topology when all devices are used.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def describe_run(devices) -> str:
  """The run's shape for its first line: '8 x cpu' (one process), '2 processes x 4 x cpu' (the
  devices of each process, alike on every one), '3 processes, 8 x cpu' otherwise."""
  devices = list(devices)
  per_process = {}
  for d in devices:
    per_process.setdefault(d.process_index, []).append(d)
  if len(per_process) <= 1:
    return chips.describe_devices(devices)
  first = per_process[min(per_process)]
  if any(len(local) != len(first) for local in per_process.values()):
    return f'{len(per_process)} processes, {chips.describe_devices(devices)}'
  return f'{len(per_process)} processes x {chips.describe_devices(first)}'


def _cluster_types() -> list:
  """JAX's own cluster environments (jax._src.clusters), or [] where that private API moved."""
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
    return list(clusters.ClusterEnv._cluster_types)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  # private API moved: no auto-detection
    return []


def _on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM (jax's own cluster detection; False wherever it cannot tell)."""
  try:
    return any(c.is_env_present() for c in _cluster_types() if 'Tpu' in c.__name__)
  except Exception:  # pylint: disable=broad-except
    return False


# The schedulers that start every process of a run themselves and tell each one its place through
# environment variables JAX reads (its cluster name -> how messages name it): SLURM's srun
# (SLURM_NTASKS, SLURM_PROCID, SLURM_STEP_NODELIST: the coordinator is the step's first node, on
# a port derived from the job id) and Open MPI's mpirun.
SCHEDULERS = {'slurm': 'SLURM', 'ompi': 'Open MPI'}


@dataclasses.dataclass(frozen=True)
class SchedulerTask:
  """This process as one task of a run a scheduler started."""
  scheduler: str  # 'SLURM', 'Open MPI'
  coordinator_address: str
  num_processes: int
  process_id: int

  def describe(self) -> str:
    job = os.environ.get('SLURM_JOB_ID') if self.scheduler == 'SLURM' else None
    where = f'job {job}, ' if job else ''
    return (f"{self.scheduler}'s task variables ({where}task {self.process_id} of "
            f'{self.num_processes}, coordinator {self.coordinator_address})')


def scheduler_task() -> Optional[SchedulerTask]:
  """This process's place in a run started by srun or mpirun (JAX's cluster detection), or None
  (no such scheduler, or its variables cannot be read)."""
  for cluster in _cluster_types():
    if getattr(cluster, 'name', None) not in SCHEDULERS:
      continue
    try:
      if not cluster.is_env_present():
        continue
      port = os.environ.get('JAX_COORDINATOR_PORT')  # JAX's own override of the derived port
      return SchedulerTask(SCHEDULERS[cluster.name],
                           cluster.get_coordinator_address(None, port),
                           int(cluster.get_process_count()), int(cluster.get_process_id()))
    except (KeyError, ValueError, RuntimeError):  # a variable missing or malformed
      continue
  return None


# The flags' values from the environment, when no flag is given (a cluster's launcher sets them
# per host, so that every host runs the same command line).
ENV_VARS = ('VIT_JAX_COORDINATOR_ADDRESS', 'VIT_JAX_NUM_PROCESSES', 'VIT_JAX_PROCESS_ID')


def _from_environment():
  address, count, index = (os.environ.get(k) or None for k in ENV_VARS)
  try:
    return address, None if count is None else int(count), None if index is None else int(index)
  except ValueError:
    raise UserError(f'{ENV_VARS[1]}={count} / {ENV_VARS[2]}={index}: both must be integers') from None


def init_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *,
                     timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
  """Starts the JAX distributed runtime when more than one process takes part.

  In order: --coordinator_address/--num_processes/--process_id; else the environment variables
  VIT_JAX_COORDINATOR_ADDRESS, VIT_JAX_NUM_PROCESSES, VIT_JAX_PROCESS_ID; else the task
  variables of a scheduler that started several processes (SLURM's srun, Open MPI's mpirun:
  `scheduler_task`); else a Cloud TPU VM (every worker of a pod slice) is detected. Elsewhere, or
  with VIT_JAX_NO_AUTO_DISTRIBUTED set and nothing given, it is a no-op. If the other processes
  do not arrive within `timeout_s`, it fails with one line saying so.
  """
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if not any(given) and any(os.environ.get(k) for k in ENV_VARS):
    coordinator_address, num_processes, process_id = _from_environment()
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if not any(given):
    if os.environ.get('VIT_JAX_NO_AUTO_DISTRIBUTED'):
      return
    task = scheduler_task()
    if task is not None:
      if task.num_processes > 1:
        _use_gloo_on_cpu()
        _initialize(dict(coordinator_address=task.coordinator_address,
                         num_processes=task.num_processes, process_id=task.process_id),
                    task.describe(), timeout_s, task.num_processes, SCHEDULER_HINT)
      return
    if _on_cloud_tpu_vm():
      _initialize({}, 'the Cloud TPU coordinator', timeout_s)
    return
  if num_processes is not None and num_processes <= 1 and coordinator_address is None:
    return
  if not all(given):
    raise UserError('multi-process runs need all of --coordinator_address=HOST:PORT, '
                    '--num_processes=N and --process_id=I (0..N-1) on every process')
  if not 0 <= process_id < num_processes:
    raise UserError(f'--process_id={process_id} is not in 0..{num_processes - 1}: number the '
                    f'processes 0 to --num_processes-1')
  if ':' not in coordinator_address:
    raise UserError(f'--coordinator_address={coordinator_address} has no port: use HOST:PORT '
                    f'(the address of process 0), e.g. 10.0.0.2:8476')
  _use_gloo_on_cpu()
  _initialize(dict(coordinator_address=coordinator_address, num_processes=num_processes,
                   process_id=process_id),
              f'the coordinator at {coordinator_address}', timeout_s, num_processes)


def _use_gloo_on_cpu() -> None:
  """CPU processes talk through gloo (only CPU collectives use this; TPUs and GPUs ignore it)."""
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')


TPU_HINT = 'on a TPU VM: gcloud ... ssh --worker=all'
SCHEDULER_HINT = "srun and mpirun start it once per task: the job's log says why others did not"


def _initialize(kwargs: dict, what: str, timeout_s: int, num_processes: int | None = None,
                hint: str = TPU_HINT):
  """jax.distributed.initialize, but a timeout is one clear line and exit status 2.

  When peers do not arrive, JAX's client terminates the process with a C++ fatal log and a stack
  trace (its error callback cannot be replaced from Python). A watchdog thread (the connect
  releases the GIL) fires first, at `timeout_s`, while JAX's own deadline is set later; nothing
  has been written at this point, so exiting at once loses nothing.
  """
  others = f'all {num_processes} processes' if num_processes else 'every worker'
  message = (f'error: the distributed runtime did not start within {timeout_s} s through {what}: '
             f'start the same command on {others} ({hint}), '
             f'check that process 0 runs and that its port is reachable, or raise '
             f'--distributed_timeout\n')
  started = threading.Event()

  def give_up():
    if not started.is_set():
      os.write(2, message.encode())
      os._exit(EXIT_USER_ERROR)  # pylint: disable=protected-access

  watchdog = threading.Timer(timeout_s, give_up)
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s + JAX_DEADLINE_MARGIN_S)
  except Exception as e:  # pylint: disable=broad-except  # bad address, port in use, ...
    text = ' '.join(str(e).split())[:200]
    raise UserError(f'the distributed runtime did not start through {what} '
                    f'({type(e).__name__}: {text}): check --coordinator_address, and start the '
                    f'same command on {others}') from None
  finally:
    started.set()
    watchdog.cancel()


def run_record(workdir: str, config: Mapping, argv: Sequence[str]) -> dict:
  """What every process of one run must share: its workdir, its resolved config (flattened to
  'key.sub': repr) and its command line without the flags that number the processes."""
  own = ('--process_id', '-process_id')
  return {'workdir': str(workdir), 'config': _flat(config),
          'argv': [a for a in argv if a.split('=')[0] not in own]}


def _flat(config: Mapping, prefix: str = '') -> dict:
  out = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = repr(value)
  return out


def first_difference(records: Sequence[dict]) -> Optional[str]:
  """The line refusing a run whose processes disagree (`run_record`s in process order): the
  first process that differs from process 0, and the first thing it differs in (workdir, then
  config keys, then the command line); None when all agree."""
  base = records[0]
  for index, other in enumerate(records[1:], start=1):
    found = None
    if other['workdir'] != base['workdir']:
      found = f'--workdir is {base["workdir"]} on process 0 but {other["workdir"]}'
    for key in sorted(set(base['config']) | set(other['config'])) if found is None else ():
      mine, theirs = base['config'].get(key, 'unset'), other['config'].get(key, 'unset')
      if mine != theirs:
        found = f'config.{key} is {mine} on process 0 but {theirs}'
        break
    if found is None and other['argv'] != base['argv']:
      i = next((i for i, (a, b) in enumerate(zip(base['argv'], other['argv'])) if a != b),
               min(len(base['argv']), len(other['argv'])))
      mine, theirs = (r['argv'][i] if i < len(r['argv']) else 'nothing' for r in (base, other))
      found = f'command-line argument {i + 1} is {mine} on process 0 but {theirs}'
    if found is not None:
      return (f'the processes of this run disagree: {found} on process {index}; start every '
              f'process with the same command line (a per-process value such as '
              f'$SLURM_PROCID in a flag splits the run)')
  return None


def check_agreement(record: dict, *, timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
  """Where the processes of a multi-process run first meet (after `init_distributed`, before
  anything is written): every process publishes its `run_record` in the distributed runtime's
  key-value store, waits for the others and compares them all; a mismatch is the same UserError
  on every process (`first_difference`). A no-op on one process."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=g-import-not-at-top  # the runtime's store
  client = distributed.global_state.client
  directory = 'vit_jax/run_record/'
  client.key_value_set(f'{directory}{jax.process_index()}', json.dumps(record))
  client.wait_at_barrier('vit_jax_run_agreement', timeout_in_ms=timeout_s * 1000)
  found = {int(key.rsplit('/', 1)[-1]): json.loads(value)
           for key, value in client.key_value_dir_get(directory)}
  line = first_difference([found[i] for i in sorted(found)])
  if line is not None:
    raise UserError(line)


__all__ = ['AXES', 'check_agreement', 'first_difference', 'run_record', 'mesh_shape', 'make_mesh',
           'init_distributed', 'scheduler_task', 'SchedulerTask',
           'describe_run', 'SCHEDULERS', 'DEFAULT_TIMEOUT_S']
