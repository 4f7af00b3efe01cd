"""VTAB-1k: the 19 tasks' splits against the benchmark's (google-research/task_adaptation,
task_adaptation/data/*.py, 'train800', 'val200', 'train800val200' and 'test' of each data class),
the 7 derived labels on tfds-shaped records checked by hand, slices of a task's splits mapped to
tfds expressions, and the paper's group means."""

import importlib
import json
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import info as info_lib
from vit_jax.data import sources
from vit_jax.data.sources import vtab
from vit_jax.errors import UserError

# The tfds train/validation/test sizes of the prepared datasets the benchmark's rules cut.
TFDS_SIZES = {
    'caltech101': {'train': 3060, 'test': 6084},
    'cifar100': {'train': 50000, 'test': 10000},
    'oxford_iiit_pet': {'train': 3680, 'test': 3669},
    'svhn_cropped': {'train': 73257, 'test': 26032},
    'eurosat/rgb': {'train': 27000},
    'resisc45': {'train': 31500},
    'clevr': {'train': 70000, 'validation': 15000, 'test': 15000},
    'dsprites': {'train': 737280},
}

# task -> (train800val200, test) as task_adaptation writes them for these sizes.
BENCHMARK = {
    'caltech101': ('train[:800]+train[2754:2954]', 'test'),
    'cifar100': ('train[:800]+train[45000:45200]', 'test'),
    'dtd': ('train[:800]+validation[:200]', 'test'),
    'oxford_flowers102': ('train[:800]+validation[:200]', 'test'),
    'oxford_iiit_pet': ('train[:800]+train[2944:3144]', 'test'),
    'sun397': ('train[:800]+validation[:200]', 'test'),
    'svhn': ('train[:800]+train[65931:66131]', 'test'),
    'patch_camelyon': ('train[:800]+validation[:200]', 'test'),
    'eurosat': ('train[:800]+train[16200:16400]', 'train[21600:]'),
    'resisc45': ('train[:800]+train[18900:19100]', 'train[25200:]'),
    'diabetic_retinopathy': ('train[:800]+validation[:200]', 'test'),
    'clevr_count': ('train[:800]+train[63000:63200]', 'validation'),
    'clevr_distance': ('train[:800]+train[63000:63200]', 'validation'),
    'dmlab': ('train[:800]+validation[:200]', 'test'),
    'kitti_distance': ('train[:800]+validation[:200]', 'test'),
    'dsprites_location': ('train[:800]+train[589824:590024]', 'train[663552:]'),
    'dsprites_orientation': ('train[:800]+train[589824:590024]', 'train[663552:]'),
    'smallnorb_azimuth': ('train[:800]+test[:200]', 'test[50%:]'),
    'smallnorb_elevation': ('train[:800]+test[:200]', 'test[50%:]'),
}


def test_the_19_tasks_have_the_benchmarks_splits():
  assert set(vtab.TASKS) == set(BENCHMARK) and len(vtab.TASKS) == 19
  assert sorted(t for g in vtab.GROUPS.values() for t in g) == sorted(vtab.TASKS)
  for name, (trainval, test) in BENCHMARK.items():
    task = vtab.TASKS[name]
    splits = task.splits(TFDS_SIZES.get(task.tfds_name, {}))
    assert (splits['train800val200'], splits['test']) == (trainval, test), name
    train, val = trainval.split('+')
    assert (splits['train800'], splits['val200']) == (train, val), name


def _tensors(record):
  return tf.nest.map_structure(tf.constant, record)


def test_clevr_labels_by_hand():
  """Count: objects - 3; distance: the nearest object's depth in bins [0, 8, 8.5, 9, 9.5, 10]."""
  def clevr(depths):
    n = len(depths)
    return _tensors({'objects': {'size': np.zeros(n, np.int64),
                                 'pixel_coords': np.asarray([[10.0, 20.0, d] for d in depths],
                                                            np.float32)}})
  count, distance = vtab.LABELS['clevr_count'], vtab.LABELS['clevr_distance']
  assert int(count(clevr([9.0] * 3))) == 0 and int(count(clevr([9.0] * 10))) == 7
  cases = {(12.0, 7.9, 9.0): 0, (8.2, 11.0, 9.0): 1, (9.7, 8.6): 2, (9.2, 12.0, 30.0): 3,
           (9.9,): 4, (10.5, 11.0): 5}
  for depths, label in cases.items():
    assert int(distance(clevr(list(depths)))) == label, depths


def test_kitti_distance_by_hand():
  """The nearest car, van or truck (types 0-2) in bins [<8, <20, <999 m]; 3 when there is none;
  pedestrians (type 3) and others are ignored."""
  def kitti(objects):
    return _tensors({'objects': {
        'type': np.asarray([t for t, _ in objects], np.int64),
        'location': np.asarray([[1.0, 1.5, z] for _, z in objects], np.float32).reshape(-1, 3)}})
  label = vtab.LABELS['kitti_distance']
  assert int(label(kitti([(0, 30.0), (1, 5.0)]))) == 0
  assert int(label(kitti([(3, 2.0), (2, 12.0)]))) == 1
  assert int(label(kitti([(0, 45.0), (4, 3.0)]))) == 2
  assert int(label(kitti([(3, 4.0), (7, 9.0)]))) == 3
  assert int(label(kitti([]))) == 3


def test_dsprites_and_smallnorb_labels_by_hand():
  """dSprites: x position (32 values) and orientation (40 values) in 16 equal bins; smallNORB:
  its azimuth and elevation features as they are."""
  location, orientation = vtab.LABELS['dsprites_location'], vtab.LABELS['dsprites_orientation']
  for x, want in ((0, 0), (1, 0), (2, 1), (17, 8), (31, 15)):
    assert int(location(_tensors({'label_x_position': np.int64(x)}))) == want
  for o, want in ((0, 0), (2, 0), (3, 1), (5, 2), (39, 15)):
    assert int(orientation(_tensors({'label_orientation': np.int64(o)}))) == want
  record = _tensors({'label_azimuth': np.int64(7), 'label_elevation': np.int64(3)})
  assert int(vtab.label_fn(vtab.TASKS['smallnorb_azimuth'])(record)) == 7
  assert int(vtab.label_fn(vtab.TASKS['smallnorb_elevation'])(record)) == 3
  png = tf.io.encode_png(tf.constant([[[0], [1]]], tf.uint8))
  assert vtab.image_fn(vtab.TASKS['dsprites_location'])(png).numpy().ravel().tolist() == [0, 255]
  assert vtab.image_fn(vtab.TASKS['dtd']) is None


def _fake_builder(sizes, num_classes=47):
  class Feature:
    shape = (None, None, 3)
  names = [f'c{i}' for i in range(num_classes)]
  label = types.SimpleNamespace(num_classes=num_classes, names=names)
  info = types.SimpleNamespace(
      splits={k: types.SimpleNamespace(num_examples=v) for k, v in sizes.items()},
      features={'image': Feature(), 'label': label})
  return types.SimpleNamespace(info=info, data_dir='/nowhere/dtd/3.0.1')


def test_slices_of_a_task_split_read_the_matching_tfds_records():
  source = vtab.VtabSource('vtab/dtd', vtab.TASKS['dtd'],
                           _fake_builder({'train': 1880, 'validation': 1880, 'test': 1880}))
  assert source.split_sizes == {'train800': 800, 'val200': 200, 'train800val200': 1000,
                                'test': 1880}
  assert source.tfds_split('train800val200') == 'train[0:800]+validation[0:200]'
  assert source.tfds_split('train800val200[700:900]') == 'train[700:800]+validation[0:100]'
  assert source.tfds_split('test[:50%]') == 'test[0:940]'
  assert source.num_examples('train800val200[:90%]') == 900
  assert source.class_names[:2] == ('c0', 'c1') and source.num_classes == 47
  with pytest.raises(UserError, match="bad split 'train' for dataset 'vtab/dtd'.*train800"):
    source.num_examples('train')
  derived = vtab.VtabSource('vtab/clevr_count', vtab.TASKS['clevr_count'],
                            _fake_builder({'train': 70000, 'validation': 15000}, 0))
  assert derived.num_classes == 8 and derived.class_names == tuple('01234567')
  assert derived.tfds_split('val200') == 'train[63000:63200]'


def test_vtab_names_are_served_by_their_source_and_unknown_tasks_refused(tmp_path):
  assert sources.find('vtab/dtd') == 'vit_jax.data.sources.vtab'
  assert sources.find('cifar10') is None
  with pytest.raises(UserError, match="unknown VTAB task 'mnist'.*caltech101, cifar100"):
    info_lib.get_info('vtab/mnist', str(tmp_path))
  with pytest.raises(UserError, match="dataset 'dtd' is not prepared"):
    info_lib.get_info('vtab/dtd', str(tmp_path))


def test_group_means_and_mean_as_the_paper_reports():
  top1 = {t: 0.5 for t in vtab.GROUPS['natural']}
  top1.update({t: 0.8 for t in vtab.GROUPS['specialized']})
  top1.update({t: 0.2 for t in vtab.GROUPS['structured']})
  got = vtab.aggregate(top1)
  assert got == pytest.approx({'natural': 0.5, 'specialized': 0.8, 'structured': 0.2,
                               'mean': (7 * 0.5 + 4 * 0.8 + 8 * 0.2) / 19})
  del top1['dmlab']
  assert set(vtab.aggregate(top1)) == {'natural', 'specialized'}
  with pytest.raises(ValueError, match='not VTAB tasks: mnist'):
    vtab.aggregate({'mnist': 1.0})


def _tiny_smallnorb(data_dir: str) -> None:
  """smallNORB as tfds reads it (its own builder, features and version), prepared in `data_dir`
  from generated images: 800 train and 400 test examples, elevation = example number % 9, each
  image a flat gray whose level says its elevation."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  norb = importlib.import_module('tensorflow_datasets.datasets.smallnorb.smallnorb_dataset_builder')

  class TinyNorb(norb.Builder, skip_registration=True):
    name = 'smallnorb'
    __module__ = norb.__name__  # tfds reads the builder's files (README, citation) beside it

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):  # pylint: disable=no-self-argument
      return epath.Path(norb.__file__)

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples(800), 'test': self._generate_examples(400)}

    def _generate_examples(self, num):  # pylint: disable=arguments-differ
      for i in range(num):
        image = np.full((96, 96, 1), 20 * (i % 9), np.uint8)
        yield i, {'image': image, 'image2': image, 'label_category': 0, 'instance': 0,
                  'label_elevation': i % 9, 'label_azimuth': i % 18, 'label_lighting': 0}

  TinyNorb(data_dir=data_dir).download_and_prepare(download_config=tfds.download.DownloadConfig(
      try_download_gcs=False, compute_stats=tfds.download.ComputeStatsMode.SKIP))


@pytest.fixture(scope='module')
def norb_run(tmp_path_factory):
  """(data_dir with the tiny smallNORB, workdir of ViT-Ze/4 trained 4 steps on
  vtab/smallnorb_elevation's train800, evaluated on val200)."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  base = tmp_path_factory.mktemp('norb')
  data_dir = str(base / 'tfds')
  _tiny_smallnorb(data_dir)
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=4,batch_size=16')
  config.dataset, config.data_dir = 'vtab/smallnorb_elevation', data_dir
  config.train_split, config.eval_split = 'train800', 'val200'
  config.warmup_steps, config.eval_every, config.progress = 1, 4, False
  workdir = str(base / 'run')
  loop.train_and_evaluate(config, workdir)
  return data_dir, workdir


def test_a_vtab_task_streams_its_derived_splits_and_a_run_trains_on_it(norb_run):
  """vtab/smallnorb_elevation on a prepared tfds smallNORB: train800 is train[:800], val200
  test[:200], their labels the elevation feature; a tiny model fine-tunes a few steps on it."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  data_dir, workdir = norb_run
  info = data.get_info('vtab/smallnorb_elevation', data_dir)
  assert info.split_sizes == {'train800': 800, 'val200': 200, 'train800val200': 1000,
                              'test': 200}
  assert info.num_classes == 9 and info.source.tfds_split('test') == 'test[200:400]'
  records = list(pipeline.source_records(info, 'val200', cache=False).as_numpy_iterator())
  assert len(records) == 200 and sorted({int(label) for _, label in records}) == list(range(9))
  evals = [r for r in _records(workdir) if 'accuracy' in r and r['split'] != 'train']
  assert evals and evals[-1]['step'] == 4 and 0.0 <= evals[-1]['accuracy'] <= 1.0


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_the_vtab_sweep_runs_the_19_tasks_and_its_table_gives_the_papers_columns(tmp_path):
  from vit_jax.tools.sweeps import spec  # pylint: disable=g-import-not-at-top
  sweep = spec.load(os.path.join(os.path.dirname(__file__), '..', 'experiments', 'vtab',
                                 'sweep.py'))
  runs = sweep.grid_runs()
  assert sorted(r.value('dataset') for r in runs) == sorted(f'vtab/{t}' for t in vtab.TASKS)
  results = tmp_path / 'results.csv'
  lines = ['phase,run,dataset,accuracy,status,seconds']
  lines += [f'final,{t},vtab/{t},{0.9 if t in vtab.GROUPS["natural"] else 0.6},done,1'
            for t in vtab.TASKS if t != 'dmlab'] + ['final,dmlab,vtab/dmlab,,failed,1']
  results.write_text('\n'.join(lines) + '\n')
  top1 = vtab.from_sweep(str(results))
  assert len(top1) == 18 and top1['dtd'] == 0.9 and top1['eurosat'] == 0.6
  text = vtab.table(top1)
  assert '| natural | dtd | 90.0 |' in text and '| natural | mean | 90.0 |' in text
  assert '| specialized | mean | 60.0 |' in text
  assert 'structured | mean' not in text and 'all 19' not in text  # dmlab failed
  top1['dmlab'] = 0.6
  assert f'| all 19 | mean | {100 * (7 * 0.9 + 12 * 0.6) / 19:.1f} |' in vtab.table(top1)
  # The sweep's results.md ends with the same table, made from its runs' rows.
  rows = [{'dataset': f'vtab/{t}', 'accuracy': v} for t, v in top1.items()]
  assert sweep.summary(rows) == vtab.table(top1)


# ---------------------------------------------------------------------------------------------
# `python -m vit_jax evaluate --evals=vtab`: the fine-tunes as trials, then the table.

_TINY_FINETUNE = ('total_steps=2,warmup_steps=1,eval_every=2,checkpoint_every=2,log_every=1,'
                  'image_size=16,batch_size=8,eval_batch_size=8')
_NORB = 'smallnorb_azimuth+smallnorb_elevation'


def _evaluate(workdir, data_dir, say):
  from vit_jax.evaluate import checkpoint  # pylint: disable=g-import-not-at-top
  model, params, config, identity = checkpoint.load_run_checkpoint(workdir, None)
  config.data_dir = data_dir
  from vit_jax.tools.sweeps import trials  # pylint: disable=g-import-not-at-top
  options = {'vtab': {'tasks': _NORB, 'overrides': _TINY_FINETUNE, 'launcher': 'inline'}}
  return checkpoint.evaluate(model, params, config, identity, ['vtab'], workdir=workdir,
                             say=say, options=options, train=trials.run_trials)


@pytest.mark.slow
def test_evaluate_vtab_fine_tunes_each_task_once_and_tables_their_own_accuracy(norb_run, capsys):
  """Two smallNORB tasks fine-tuned 2 steps each from the run's checkpoint: each task's value in
  the table is its trial's own last eval accuracy (on the task's test split), the structured
  mean is left out (6 of its 8 tasks did not run); a second command trains nothing."""
  from vit_jax.checkpoint import train_ckpt  # pylint: disable=g-import-not-at-top
  data_dir, workdir = norb_run
  lines = []
  out = _evaluate(workdir, data_dir, lines.append)
  trials = os.path.join(out['directory'], 'vtab')
  row = out['results']['vtab']
  assert row['type'] == 'vtab' and row['options']['tasks'] == _NORB
  assert list(row['metrics']) == ['smallnorb_azimuth', 'smallnorb_elevation']
  for task in ('smallnorb_azimuth', 'smallnorb_elevation'):
    records = _records(os.path.join(trials, f'task_{task}'))
    final = [r for r in records if r['split'] == 'eval'][-1]
    assert final['step'] == 2 and final['count'] == 200  # test[200:400]
    assert row['metrics'][task] == final['accuracy']
    config = train_ckpt.Checkpointer(os.path.join(trials, f'task_{task}'), keep=1).read_config(2)
    assert config['dataset'] == f'vtab/{task}' and config['init'].endswith('checkpoints/4')
    assert (config['lr'], config['optimizer'], config['train_split']) == (0.01, 'sgd',
                                                                          'train800val200')
  with open(os.path.join(out['directory'], 'results.json')) as f:
    assert json.load(f)['results']['vtab']['metrics'] == row['metrics']
  with open(os.path.join(trials, 'table.md')) as f:
    assert f.read() == vtab.table(row['metrics'])

  # The table is removed: the trials are read back, none is trained again.
  stamps = {t: os.path.getmtime(os.path.join(trials, t, 'metrics.jsonl')) for t in os.listdir(
      trials) if t.startswith('task_')}
  os.remove(os.path.join(out['directory'], 'results.json'))
  assert capsys.readouterr().err.count('training smallnorb_') == 2
  again = _evaluate(workdir, data_dir, lines.append)
  assert again['results']['vtab']['metrics'] == row['metrics']
  assert 'training smallnorb_' not in capsys.readouterr().err
  assert stamps == {t: os.path.getmtime(os.path.join(trials, t, 'metrics.jsonl')) for t in stamps}


def test_the_vtab_evaluator_means_each_group_over_its_own_tasks(tmp_path):
  """All 19 trials finished (their sweep_result.json): the metrics are each task's value, each
  group's mean over its tasks and the mean over the 19; no dataset is read."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluate import vtab as vtab_eval  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import runner  # pylint: disable=g-import-not-at-top
  from vit_jax.tools.sweeps import trials  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({'model_name': 'ViT-Ze/4', 'data_dir': None,
                                      'model': {'classifier': 'token'}})
  top1 = {t: (i + 1) / 40 for i, t in enumerate(vtab.TASKS)}
  for task, trial in vtab_eval.trials(config, '/ckpt/4').items():
    _, run = trials.sweep_run(task, trials.Trial(**trial))
    os.makedirs(runner.run_dir(str(tmp_path), run))
    runner.write_result(runner.run_dir(str(tmp_path), run), run, top1[task], 1.0, 2500)
  got = vtab_eval.metrics(vtab_eval.fine_tune(config, '/ckpt/4', str(tmp_path),
                                              trials.run_trials, say=print))
  for group, tasks in vtab.GROUPS.items():
    assert got[group] == pytest.approx(sum(top1[t] for t in tasks) / len(tasks))
  assert got['mean'] == pytest.approx(sum(top1.values()) / 19)
  assert {t: got[t] for t in vtab.TASKS} == top1
  assert list(got)[:7] == list(vtab.GROUPS['natural'])


def test_evaluate_refuses_an_unknown_vtab_task_in_one_line_before_loading(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'evaluate', f'--workdir={tmp_path}',
                         '--evals=vtab', '--option=vtab.tasks=dtd+mnist'],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
  assert proc.stderr.startswith("error: --option=vtab.tasks='dtd+mnist': unknown VTAB task "
                                "'mnist': use all, or task names joined by + from caltech101")
  assert os.listdir(tmp_path) == []
