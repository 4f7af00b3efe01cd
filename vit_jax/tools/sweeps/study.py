"""A sweep's Optuna studies: the storage, the sampler and pruner of a spec, and the trials read
back as one outcome per run.

Storage: by default an SQLite file in the sweep's workdir (`study.db`, no server; one sweep
process per directory). `--storage=URL` names a database that every worker reaches (PostgreSQL:
postgresql://user:password@host:port/db, MySQL with its driver installed); the workers of one
sweep share its study, each trial in its own sub-workdir of the sweep's workdir. Every storage
keeps a heartbeat per running trial: a trial whose worker stopped beating for `2 x heartbeat`
seconds is failed by the next worker that looks, and retried (up to MAX_RETRY times) as a new
trial with the same values, which resumes the run's checkpoint in the same sub-workdir.

A sweep has one study per phase: '<name>' for the grid (or sampled) runs and '<name>/final' for
the final runs of the best setting(s). Every trial carries the user attribute 'run' (the run's
name = its sub-workdir); a trial that found its run taken by an earlier trial ends as FAIL with
'duplicate_of', and only one trial per run is counted.
"""

import os
import time
import warnings
from typing import Dict, List, Optional

from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.tools.sweeps.spec import PRUNERS, Run, Sweep

DB_FILE = 'study.db'
MAX_RETRY = 3
FINAL = 'final'  # the parameter of a final-phase trial: the run's name


def _optuna():
  import optuna  # pylint: disable=g-import-not-at-top
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  warnings.filterwarnings('ignore', category=optuna.exceptions.ExperimentalWarning)
  # Heartbeats are ours (worker._Heartbeat), not Study.optimize's.
  warnings.filterwarnings('ignore', message='Heartbeat of storage is supposed to be used')
  return optuna


def default_name(workdir: str) -> str:
  return workdir if is_remote(workdir) else os.path.abspath(workdir)


def storage_url(workdir: str, url: Optional[str]) -> str:
  if url:
    return url
  if is_remote(workdir):
    raise UserError(f'--workdir={workdir} is not on this machine, so the default study file '
                    f'cannot live there: pass --storage=URL, a database every worker reaches '
                    f'(e.g. postgresql://user:password@host:5432/db)')
  return 'sqlite:///' + os.path.join(os.path.abspath(workdir), DB_FILE)


def _shown(url: str) -> str:
  try:
    import sqlalchemy  # pylint: disable=g-import-not-at-top
    return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
  except Exception:  # pylint: disable=broad-except  # not a URL at all: said below
    return url


def open_storage(url: str, heartbeat_s: int):
  """An Optuna RDB storage with heartbeats and retries; an unreachable database is one line."""
  optuna = _optuna()
  import sqlalchemy  # pylint: disable=g-import-not-at-top
  kwargs = {'pool_pre_ping': True}
  try:
    dialect = sqlalchemy.engine.make_url(url).get_backend_name()
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f'--storage={url} is not a database URL ({e}): use e.g. '
                    f'postgresql://user:password@host:5432/db') from None
  if dialect == 'postgresql':
    kwargs['connect_args'] = {'connect_timeout': 10}
  elif dialect == 'sqlite':
    kwargs['connect_args'] = {'timeout': 60}
  last = None
  for attempt in range(3):  # workers that create the tables at once may collide: try again
    try:
      storage = optuna.storages.RDBStorage(
          url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s,
          heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
              max_retry=MAX_RETRY))
      if dialect == 'sqlite':
        _sqlite_wal(storage.engine)
      return storage
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as e:
      last = e
      if 'refused' in str(e) or 'could not translate' in str(e) or 'timeout' in str(e):
        break
      time.sleep(0.5 * (attempt + 1))
    except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
      # Two workers creating the schema at once: a duplicate row (IntegrityError) or, on
      # PostgreSQL, "relation alembic_version already exists" (ProgrammingError) for the later.
      if isinstance(e, sqlalchemy.exc.ProgrammingError) and 'already exists' not in str(e):
        raise
      last = e
      time.sleep(0.5 * (attempt + 1))
    except sqlalchemy.exc.DatabaseError as e:  # not a database, or a damaged one
      raise UserError(damaged(url, e)) from None
    except (ImportError, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as e:
      e = e.__cause__ or e.__context__ or e  # Optuna's ImportError wraps the missing module's
      raise UserError(f'cannot use the study database {_shown(url)} ({type(e).__name__}: '
                      f'{_first_line(e)}): PostgreSQL (postgresql://) and SQLite work as '
                      f'installed; another database needs its Python driver') from None
  raise UserError(f'cannot reach the study database {_shown(url)} ({_first_line(last)}): check '
                  f'the URL and that the server runs and accepts connections from this host')


def damaged(url: str, error: BaseException) -> str:
  """The line for a study database that is not one, or is damaged (a truncated or overwritten
  SQLite file): the runs' workdirs keep their results, so a new study resumes from them."""
  return (f'the study database {_shown(url)} is damaged or not a database ({_first_line(error)}): '
          f'move it away and rerun the same command to start a new study (each run keeps its '
          f'workdir)')


def _sqlite_wal(engine) -> None:
  """SQLite in write-ahead-log mode with synchronous=NORMAL: a commit no longer waits for the
  disk (one fsync per commit made each trial's bookkeeping wait on a busy disk); a killed
  process still loses nothing committed, only a power cut could lose the last commits."""
  import sqlalchemy  # pylint: disable=g-import-not-at-top

  def pragmas(connection, record):
    del record
    cursor = connection.cursor()
    cursor.execute('PRAGMA journal_mode=WAL')
    cursor.execute('PRAGMA synchronous=NORMAL')
    cursor.close()

  sqlalchemy.event.listen(engine, 'connect', pragmas)
  engine.dispose()  # the connections opened before use the pragmas too


def _first_line(e) -> str:
  text = str(getattr(e, 'orig', None) or e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def sampler(sweep: Sweep, runs: Optional[List[Run]]):
  """The grid sampler over the grid (runs: None) or over the given final runs' names; with
  ranges, TPE or random (seeded: the same spec samples the same first points)."""
  optuna = _optuna()
  if runs is not None:
    return optuna.samplers.GridSampler({FINAL: [r.name for r in runs]}, seed=0)
  if not sweep.ranges:
    return optuna.samplers.GridSampler(sweep.grid, seed=0)
  if sweep.sampler == 'random':
    return optuna.samplers.RandomSampler(seed=0)
  return optuna.samplers.TPESampler(seed=0)


def pruner(sweep: Sweep, final: bool = False):
  """The spec's pruner for the search; the final runs (the chosen setting's numbers) run out."""
  optuna = _optuna()
  if not sweep.pruner or final:
    return optuna.pruners.NopPruner()
  options = {k: v for k, v in sweep.pruner.items() if k != 'name'}
  cls = getattr(optuna.pruners, PRUNERS[sweep.pruner['name']])
  try:
    return cls(**options)
  except (TypeError, ValueError) as e:
    raise UserError(f'pruner {sweep.pruner!r} in {sweep.path}: {e} (the options are the '
                    f'keyword arguments of optuna.pruners.{cls.__name__})') from None


def open_study(storage, name: str, sweep: Sweep, final_runs: Optional[List[Run]] = None):
  optuna = _optuna()
  study_name = name if final_runs is None else f'{name}/{FINAL}'
  for attempt in range(3):
    try:
      return optuna.create_study(storage=storage, study_name=study_name, direction='maximize',
                                 sampler=sampler(sweep, final_runs),
                                 pruner=pruner(sweep, final=final_runs is not None),
                                 load_if_exists=True)
    except Exception:  # pylint: disable=broad-except  # two workers creating it at once
      if attempt == 2:
        raise
      time.sleep(0.5)


def suggest(trial, sweep: Sweep, final_runs: Optional[List[Run]]) -> Run:
  """The run of a new (or enqueued) trial: its values from the trial's sampler."""
  if final_runs is not None:
    names = [r.name for r in final_runs]
    return final_runs[names.index(trial.suggest_categorical(FINAL, names))]
  values = {}
  for key in sweep.keys:
    if key in sweep.ranges:
      r = sweep.ranges[key]
      suggest_fn = trial.suggest_int if r['int'] else trial.suggest_float
      values[key] = suggest_fn(key, r['low'], r['high'], log=r['log'])
    else:
      values[key] = trial.suggest_categorical(key, sweep.grid[key])
  return sweep.grid_run(values)


def params_of(run: Run, final: bool) -> Dict:
  return {FINAL: run.name} if final else dict(run.values)


def runs_of(trials) -> Dict[str, list]:
  """run name -> its counted trials (duplicates left out), by trial number."""
  out: Dict[str, list] = {}
  for t in sorted(trials, key=lambda t: t.number):
    name = t.user_attrs.get('run')
    if name and 'duplicate_of' not in t.user_attrs:
      out.setdefault(name, []).append(t)
  return out


def counted(trials):
  """The one trial that counts for a run: the first COMPLETE, else the first PRUNED, else the
  last trial (failed, stopped, running or waiting)."""
  optuna = _optuna()
  for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
    done = [t for t in trials if t.state == state]
    if done:
      return done[0]
  return trials[-1] if trials else None


__all__ = ['open_storage', 'open_study', 'storage_url', 'default_name', 'suggest', 'params_of',
           'runs_of', 'counted', 'DB_FILE', 'FINAL']
