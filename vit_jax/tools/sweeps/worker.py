"""A sweep worker: takes the trials of one phase's study until every run of it has ended.

Any number of workers (processes, machines) run this loop on the same study. Each round it
fails the trials whose worker stopped beating (Optuna queues their retries), then takes a trial
when one can still be taken: a retry (a WAITING trial) first, else a fresh one while a grid run
has no trial yet (or, with ranges, while fewer runs than `trials` were sampled). With nothing to
take but trials still running elsewhere it waits, since one of them may yet die and come back as
a retry. A fresh trial whose run an earlier trial already holds (two workers took the last grid
point at once) ends as FAIL with 'duplicate_of' and trains nothing; with ranges, a fresh trial
whose earlier trials already fill the budget (two workers took the last sample at once) ends as
FAIL with 'over_budget' and trains nothing, so a study never samples more than `trials` runs.

A run trains in `<workdir>/<run name>/` (runner.run_one); each evaluation record the trainer
appends to its metrics.jsonl is reported to the trial (`Reporter`), and when the study's pruner
says so the trainer gets a SIGTERM: it saves a checkpoint and stops, the trial ends as PRUNED.
"""

import dataclasses
import os
import threading
import time
from typing import Callable, List, Optional

from vit_jax.tools.sweeps import runner
from vit_jax.tools.sweeps import study as study_lib
from vit_jax.tools.sweeps.spec import Run, Sweep

POLL_S = 0.5


@dataclasses.dataclass
class Phase:
  sweep: Sweep
  study: object                  # optuna.Study
  runs: Optional[List[Run]]      # the runs of a grid or final phase; None: sampled (ranges)
  final: bool = False

  @property
  def budget(self) -> int:
    return len(self.runs) if self.runs is not None else self.sweep.trials


class Reporter:
  """Reports a run's evaluations (`sweep.metric` of its 'eval' records) to its trial, in step
  order, and asks the pruner after each. An evaluation counts once a later record shows it was
  not the run's last (or, once the trainer has ended, if it is not the last evaluation): the
  final evaluation is the trial's value, never a reason to prune. So the decision depends on the
  records only, not on when they are read."""

  def __init__(self, trial, run_workdir: str, metric: str):
    self.trial, self.metric = trial, metric
    self.path = os.path.join(run_workdir, 'metrics.jsonl')
    self.reported = set()
    self.pruned = None  # (step, value) of the evaluation after which the pruner stopped the run

  def poll(self, ended: bool = False) -> bool:
    """Reports what is new; True once the run is to be pruned."""
    if self.pruned is not None:
      return True
    from vit_jax.run import logs  # pylint: disable=g-import-not-at-top
    records = logs.read_metrics(self.path)
    evals = [r for r in records if r['split'] == 'eval' and self.metric in r]
    newest = max((r['step'] for r in records), default=0)
    for i, record in enumerate(evals):
      step = record['step']
      last = i == len(evals) - 1
      if step in self.reported:
        continue
      if (ended and last) or (not ended and step >= newest):
        break
      self.reported.add(step)
      value = float(record[self.metric])
      self.trial.report(value, step)
      if self.trial.should_prune():
        self.pruned = (step, value)
        return True
    return False


class _Heartbeat:
  """Beats for a running trial every `interval_s` seconds in a thread."""

  def __init__(self, storage, trial, interval_s: float):
    self._stop = threading.Event()
    self._storage, self._trial_id, self._interval = storage, trial._trial_id, interval_s  # pylint: disable=protected-access
    self._thread = threading.Thread(target=self._beat, name='trial_heartbeat', daemon=True)

  def _beat(self):
    while not self._stop.is_set():
      try:
        self._storage.record_heartbeat(self._trial_id)
      except Exception:  # pylint: disable=broad-except  # a lost connection: beat again later
        pass
      self._stop.wait(self._interval)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


def _state():
  return study_lib._optuna().trial.TrialState  # pylint: disable=protected-access


def prepare(phase: Phase, root: str, storage, *, exclusive: bool) -> None:
  """Before a worker starts: with the directory's own study (exclusive), trials still RUNNING are
  of a sweep that died: they fail now. Runs finished by an older sweep (their sweep_result.json
  exists, the study has no COMPLETE trial) are added to the study. Runs whose trials all failed
  (errors, stopped sweeps, or retries used up) are queued again, as a rerun retried them before."""
  optuna = study_lib._optuna()  # pylint: disable=protected-access
  state = _state()
  study = phase.study
  if exclusive:
    for t in study.get_trials(deepcopy=False, states=(state.RUNNING,)):
      storage.set_trial_state_values(t._trial_id, state=state.FAIL)  # pylint: disable=protected-access
  if phase.runs is None:
    return
  per_run = study_lib.runs_of(study.get_trials(deepcopy=False))
  for run in phase.runs:
    trials = per_run.get(run.name, [])
    if any(t.state in (state.COMPLETE, state.PRUNED) for t in trials):
      continue
    done = runner.read_result(root, run)
    params = study_lib.params_of(run, phase.final)
    if done is not None and done.get('metric') is not None:
      dists = {k: optuna.distributions.CategoricalDistribution(
          [r.name for r in phase.runs] if phase.final else phase.sweep.grid[k]) for k in params}
      study.add_trial(optuna.trial.create_trial(
          params=params, distributions=dists, value=float(done['metric']),
          user_attrs={'run': run.name, 'seconds': done.get('seconds'), 'step': done.get('step')}))
    elif trials and all(t.state == state.FAIL for t in trials):
      study.enqueue_trial(params, user_attrs={'run': run.name})


def finished_before(phase: Phase, say: Callable[[str], None]) -> None:
  if phase.runs is None:
    return
  per_run = study_lib.runs_of(phase.study.get_trials(deepcopy=False))
  for i, run in enumerate(phase.runs):
    t = study_lib.counted(per_run.get(run.name, []))
    if t is not None and t.state == _state().COMPLETE:
      say(f'[{i + 1}/{len(phase.runs)}] {run.name}: finished before ({phase.sweep.metric} '
          f'{t.value}), skipped')


def _can_take(phase: Phase, trials) -> Optional[bool]:
  """True: a trial can be taken; False: wait (others still run); None: the phase has ended."""
  state = _state()
  if any(t.state == state.WAITING for t in trials):
    return True
  per_run = study_lib.runs_of(trials)
  if phase.runs is not None:
    fresh_left = any(r.name not in per_run for r in phase.runs)
  else:  # a sampler that keeps proposing taken runs (a small discrete space) ends it too
    duplicates = sum('duplicate_of' in t.user_attrs for t in trials)
    fresh_left = not _over_budget(phase, None, trials) and duplicates < phase.budget
  if fresh_left:
    return True
  return False if any(t.state == state.RUNNING for t in trials) else None


def _over_budget(phase: Phase, number: Optional[int], trials) -> bool:
  """Ranges: whether the trials numbered before `number` (None: all) fill the budget. Trial numbers
  are handed out by the storage one at a time, so of two workers that took the last sample at
  once only the later one finds the budget full. Counted: each sampled run, whatever became of
  it (a failed run is retried, not replaced; its retries count once), and each trial taken a
  moment ago and not named yet; not counted: duplicates, trials over the budget, and trials that
  failed before they were named (they never ran)."""
  state = _state()
  runs, unnamed = set(), 0
  for t in trials:
    if (number is not None and t.number >= number) or {'duplicate_of', 'over_budget'} & set(
        t.user_attrs):
      continue
    if 'run' in t.user_attrs:
      runs.add(t.user_attrs['run'])
    elif t.state != state.FAIL:
      unnamed += 1
  return len(runs) + unnamed >= phase.budget


def _duplicate_of(number: int, name: str, trials) -> Optional[int]:
  state = _state()
  for t in study_lib.runs_of(trials).get(name, []):
    if t.number == number:
      continue
    if t.state in (state.COMPLETE, state.PRUNED) or (
        t.state in (state.RUNNING, state.WAITING) and t.number < number):
      return t.number
  return None


def work(phase: Phase, root: str, storage, *, launcher: str, trainers, heartbeat_s: float,
         lock_wait_s: float, say: Callable[[str], None]) -> None:
  """Takes and runs this phase's trials until it has ended (or the sweep is stopped)."""
  optuna = study_lib._optuna()  # pylint: disable=protected-access
  state = _state()
  study = phase.study
  while not trainers.stopping:
    optuna.storages.fail_stale_trials(study)
    can = _can_take(phase, study.get_trials(deepcopy=False))
    if can is None:
      return
    if not can:
      time.sleep(POLL_S)
      continue
    trial = study.ask()
    fresh = 'run' not in trial.user_attrs  # a retry comes named: its run is in the budget
    if phase.runs is None and fresh and _over_budget(phase, trial.number,
                                                    study.get_trials(deepcopy=False)):
      trial.set_user_attr('over_budget', True)
      tell(study, trial, state=state.FAIL)
      time.sleep(POLL_S)
      continue
    run = study_lib.suggest(trial, phase.sweep, phase.runs if phase.final else None)
    trial.set_user_attr('run', run.name)
    duplicate = _duplicate_of(trial.number, run.name, study.get_trials(deepcopy=False))
    if duplicate is not None:
      trial.set_user_attr('duplicate_of', duplicate)
      tell(study, trial, state=state.FAIL)
      continue
    _run_trial(phase, root, storage, trial, run, launcher=launcher, trainers=trainers,
               heartbeat_s=heartbeat_s, lock_wait_s=lock_wait_s, say=say)


def _label(phase: Phase, run: Run) -> str:
  if phase.runs is None:
    return run.name
  return f'[{[r.name for r in phase.runs].index(run.name) + 1}/{len(phase.runs)}] {run.name}'


def _run_trial(phase, root, storage, trial, run, *, launcher, trainers, heartbeat_s, lock_wait_s,
               say) -> None:
  state = _state()
  sweep = phase.sweep
  label = _label(phase, run)
  say(f'{label}: running')
  reporter = Reporter(trial, runner.run_dir(root, run), sweep.metric)
  with _Heartbeat(storage, trial, heartbeat_s):
    outcome = runner.run_one(sweep, run, runner.run_dir(root, run), launcher, trainers,
                             reporter=reporter, lock_wait_s=lock_wait_s)
  if outcome.status == 'done':
    trial.set_user_attr('seconds', outcome.seconds)
    study_tell = dict(values=outcome.metric)
    say(f'{label}: done, {sweep.metric} {outcome.metric:.4f} in {outcome.seconds:.0f} s')
  elif outcome.status == 'pruned':
    trial.set_user_attr('seconds', outcome.seconds)
    trial.set_user_attr('pruned_step', outcome.step)
    study_tell = dict(state=state.PRUNED)
    say(f'{label}: pruned after the evaluation of step {outcome.step} ({sweep.metric} '
        f'{outcome.metric:.4f}); its checkpoint stays')
  else:
    trial.set_user_attr('stopped' if outcome.status == 'stopped' else 'error',
                        (outcome.error or '')[:1000])
    study_tell = dict(state=state.FAIL)
    say(f'{label}: {outcome.status} ({outcome.error})')
  tell(phase.study, trial, **study_tell)
  if outcome.status == 'stopped':  # this worker was stopped (preempted): the run goes back in
    # the queue, for another worker (or this sweep's rerun) to resume from its checkpoint
    phase.study.enqueue_trial(study_lib.params_of(run, phase.final), user_attrs={'run': run.name})


def tell(study, trial, **kwargs) -> None:
  """study.tell; the grid sampler's study.stop() once the grid is covered is for Study.optimize
  (it raises outside it, after the trial's state is stored): this loop ends on its own."""
  try:
    study.tell(trial, **kwargs)
  except RuntimeError as e:
    if 'Study.stop' not in str(e):
      raise
  except KeyError as e:
    # The grid sampler's after_trial reads 'grid_id', which a trial enqueued with fixed params
    # (the retry of a run a killed sweep left running) does not have, when one grid point is left.
    # Optuna stores the trial's state before that raises; the check only serves Study.stop.
    if e.args != ('grid_id',):
      raise


def outcomes(phase: Phase, stopping: bool = False) -> List[runner.Outcome]:
  """One outcome per run (in the phase's order; sampled runs in the order they were taken); a
  run without a trial was not started (`stopping`: the sweep was stopped) or failed."""
  state = _state()
  per_run = study_lib.runs_of(phase.study.get_trials(deepcopy=False))
  runs = phase.runs
  if runs is None:
    runs = []
    for name, trials in per_run.items():
      params = trials[0].params
      runs.append(phase.sweep.grid_run({k: params[k] for k in phase.sweep.keys}))
  out = []
  for run in runs:
    t = study_lib.counted(per_run.get(run.name, []))
    seconds = t.user_attrs.get('seconds') if t is not None else None
    if t is None:
      out.append(runner.Outcome(run, 'stopped' if stopping else 'failed', error='not started'))
    elif t.state == state.COMPLETE:
      out.append(runner.Outcome(run, 'done', t.value, seconds))
    elif t.state == state.PRUNED:
      step = t.user_attrs.get('pruned_step', t.last_step)
      out.append(runner.Outcome(run, 'pruned', t.intermediate_values.get(step), seconds,
                                step=step))
    elif 'stopped' in t.user_attrs or t.state in (state.RUNNING, state.WAITING):
      out.append(runner.Outcome(run, 'stopped', error=t.user_attrs.get('stopped')))
    else:
      out.append(runner.Outcome(run, 'failed', error=t.user_attrs.get('error', 'its worker '
                                                                      'died too often')))
  return out


__all__ = ['Phase', 'Reporter', 'prepare', 'finished_before', 'work', 'outcomes']
