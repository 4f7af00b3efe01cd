"""Scoring one checkpoint (or released weights) on a list of evaluators: what
`python -m vit_jax evaluate` runs.

The names are entries of the run's `config.evals` (their options), registered evaluator types
(their defaults) or suites (registry.py). The model and its eval preprocessing come from the
config stored with the checkpoint, the params are its Polyak average when the run kept one (what
its own evaluations scored). Features go through one cache per checkpoint in
`<workdir>/features/` (features.py), the table to `<workdir>/evaluations/<checkpoint>/`
(results.py); a rerun skips the evaluators the table holds and the feature chunks the cache holds.
"""

import hashlib
import os
import time
from typing import Callable, Dict, Optional, Sequence

import jax
import ml_collections

from vit_jax.errors import UserError
from vit_jax.evaluate import features as features_lib
from vit_jax.evaluate import registry
from vit_jax.evaluate import results as results_lib


def checkpoint_identity(step_dir) -> dict:
  """A step directory's identity: its step, path and a digest of its files' sizes and checksums
  (the manifest's, or computed when the step has none)."""
  from vit_jax.checkpoint import integrity  # pylint: disable=g-import-not-at-top
  manifest = os.path.join(os.fspath(step_dir), integrity.MANIFEST)
  if os.path.exists(manifest):
    with open(manifest, 'rb') as f:
      content = hashlib.sha256(f.read()).hexdigest()[:16]
  else:
    content = features_lib.digest(integrity.describe(step_dir))
  return {'step': int(os.path.basename(os.fspath(step_dir).rstrip('/'))),
          'path': os.path.abspath(os.fspath(step_dir)), 'content': content}


def file_identity(name: str, path: str) -> dict:
  """Released weights' identity: their name and a digest of the file's bytes."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return {'weights': name, 'content': digest.hexdigest()[:16]}


def load_run_checkpoint(workdir: str, step: Optional[str]):
  """(model, params, config, identity) of the run's newest readable checkpoint, or of `step`."""
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoint import restore  # pylint: disable=g-import-not-at-top
  passed = []
  while True:
    step_dir = inputs.resolve_checkpoint(workdir, step, passed=passed)
    try:
      model, params, config = inputs.load_model(step_dir, averaged=True)
      return model, params, config, checkpoint_identity(step_dir)
    except restore.Damaged:
      if step is not None:
        raise
      passed.append(int(os.path.basename(os.fspath(step_dir))))


def load_weights(source: str, model_name: Optional[str], dataset: Optional[str],
                 size_if_unsaid: Optional[int] = None, needs_dataset: bool = True):
  """(model, params, config, identity) of released weights by name or a params file: the config
  is the schema's defaults at the weights' model and image size, on `dataset` (which may be
  left out when no evaluator reads it: `needs_dataset` False)."""
  from vit_jax.analysis import inputs  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax.formats import weights  # pylint: disable=g-import-not-at-top
  if not dataset and needs_dataset:
    raise UserError(f'--weights={source} carries no dataset: pass --dataset=NAME (the dataset '
                    f'the evaluators read, e.g. mnist5k)')
  path = weights.fetch_as(source, model_name)[0] if weights.is_name(source) else source
  if not os.path.isfile(path):
    raise weights.unknown_source(source)
  model, params, spec = inputs.load_params_file(source, model_name, size_if_unsaid)
  config = common.base_config()
  config.model_name, config.dataset, config.image_size = (spec.model_name, dataset or '',
                                                         spec.image_size)
  return model, params, config, file_identity(source, path)


def init_of(identity: dict) -> str:
  """What a fine-tune of the scored checkpoint starts from (its `config.init`): the step
  directory, or the released weights' name or file."""
  if 'path' in identity:
    return identity['path']
  source = identity['weights']
  return os.path.abspath(source) if os.path.isfile(source) else source


def _run_context(model, config, cache_dir: str, identity: dict, batch_size: Optional[int],
                 directory: str, train: Optional[Callable]):
  """The evaluators' `Run` over all local devices, its features cached under `cache_dir`;
  evaluators that fine-tune start from the checkpoint, by `train`, their runs in `directory`."""
  from vit_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  from vit_jax import parallel  # pylint: disable=g-import-not-at-top
  from vit_jax.data import specs  # pylint: disable=g-import-not-at-top
  from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  mesh = parallel.make_mesh(ml_collections.ConfigDict({'data': -1}))
  size = batch_size or config.eval_batch_size
  if size < 1 or size % mesh.devices.size:
    raise UserError(f'--batch_size={size} does not split over {mesh.devices.size} devices: use '
                    f'a multiple of {mesh.devices.size}')
  config.eval_batch_size = size
  # None: released weights scored only by evaluators that read their own data (no --dataset).
  info = data_lib.get_info(config.dataset, config.data_dir) if config.dataset else None
  return registry.Run(config=config, model=model, mesh=mesh,
                      param_shardings=sharding.replicated(mesh), data=info,
                      eval_pp=specs.of_config(config).eval,
                      cache=features_lib.FeatureCache(cache_dir, identity),
                      init=init_of(identity), directory=directory, train=train)


def _dataset_of(run: registry.Run, call) -> Optional[dict]:
  if registry.own_data(call) is not None:
    return registry.own_data(call)
  name = call.keywords.get('dataset') or run.config.dataset
  if call.name == 'real':
    return {'name': name}
  return features_lib.dataset_identity(run.info(name))


def table_dir(workdir: str, identity: dict) -> str:
  label = (f'step_{identity["step"]}' if 'step' in identity else
           'weights_' + ''.join(c if c.isalnum() or c in '-_.' else '_'
                                for c in identity['weights']))
  if 'patch_size' in identity:  # a FlexiViT run at another patch size (evaluate --patch_size)
    label += f'_patch{identity["patch_size"]}'
  return os.path.join(workdir, 'evaluations', label)


def evaluate(model, params, config, identity: dict, names: Sequence[str], *, workdir: str,
             batch_size: Optional[int] = None, say: Callable[[str], None] = print,
             options: Optional[Dict[str, dict]] = None,
             train: Optional[Callable] = None) -> dict:
  """Runs the evaluators `names` (`options`: {name: {option: value}} replacing theirs) on
  `params` and writes the results table; returns {'directory', 'checkpoint', 'results'}.
  `train`: the trainer's runner for evaluators that fine-tune (`registry.Run.train`). A Ctrl-C
  (or SIGTERM, as the command turns it into one) stops with one line naming what stands."""
  config = ml_collections.ConfigDict(config.to_dict() if hasattr(config, 'to_dict') else config)
  calls = registry.resolve(config, names, options)  # before anything is read or built
  out_dir = table_dir(workdir, identity)
  run = _run_context(model, config, os.path.join(workdir, 'features'), identity, batch_size,
                     out_dir, train)
  finished = results_lib.load(out_dir, identity)
  table = {k: v for k, v in finished.items() if k in calls}
  writer = jax.process_index() == 0
  current = None
  try:
    for name, (call, _) in calls.items():
      if results_lib.done(finished, name, call.name, call.keywords):
        say(f'{name}: in the table already (step {identity.get("step", "-")})')
        continue
      current = name
      start = time.perf_counter()
      metrics = registry.build(run, name, call).evaluation.evaluate(params)
      table[name] = results_lib.row(call.name, call.keywords, _dataset_of(run, call), metrics,
                                    time.perf_counter() - start)
      if writer:
        results_lib.save(out_dir, identity, table)
      say(f'{name}: ' + ', '.join(f'{k} {results_lib.fmt(k, v)}' for k, v in metrics.items())
          + f' ({table[name]["seconds"]:.1f} s)')
    current = None
  except KeyboardInterrupt:
    raise UserError(f'interrupted during the {current} evaluator: the finished evaluators are in '
                    f'{out_dir} and the extracted features in {workdir}/features; rerun the '
                    f'same command to resume') from None
  if writer:
    results_lib.save(out_dir, identity, table)
    results_lib.plot(out_dir, identity, table)
  return {'directory': out_dir, 'checkpoint': identity, 'results': table}


__all__ = ['checkpoint_identity', 'evaluate', 'file_identity', 'init_of', 'load_run_checkpoint',
           'load_weights', 'table_dir']
