"""Failures of the machine and mistakes at start-up, through the real command line: each ends in
one `error:` line with the fix and exit status 2, no traceback, and leaves nothing behind that
was not there (no empty workdir, no weights-cache folder). The read-only and full file systems
are real tmpfs mounts (the tests run as root). Each case is its own test; the selected cases run
as concurrent subprocesses (2 at a time) once the first of them runs."""

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
from typing import Callable, List, Optional

import numpy as np
import pytest

from vit_jax.configs import mnist5k
from image_folder_util import write_colour_folder
from vit_jax.formats import npz
from vit_jax.formats import weights
from vit_jax.tools.launch import Plan, Steps
from vit_jax.tools.launch import tools as launch_tools
from vit_jax.tools import launch
from vit_jax.train import loop
from vit_jax.run import workdir as workdir_lib
from vit_jax.errors import UserError
from helpers import ROOT, free_port

pytestmark = pytest.mark.xdist_group('reliability_inputs')

MAIN = [sys.executable, '-m', 'vit_jax.main']
TINY = '--config=configs/mnist5k.py:model_name=ViT-Ze/4,steps=2,batch_size=16'


def _cli(*args):
  return lambda r: [sys.executable, '-m', 'vit_jax', *(a.format(**r) for a in args)]


def _main(*args):
  return lambda r: [*MAIN, TINY, '--workdir={work}'.format(**r), f'--config.data_dir={r["data_dir"]}',
                    '--config.warmup_steps=1', *(a.format(**r) for a in args)]


@dataclasses.dataclass
class Case:
  name: str
  argv: Callable[[dict], List[str]]
  needles: List[str]
  absent: List[str] = dataclasses.field(default_factory=lambda: ['{work}'])  # must not exist after
  cwd: Optional[str] = None
  env: Optional[Callable[[dict], dict]] = None


CASES = [
    Case('config returns a dict', lambda r: [*MAIN, f'--config={r["dict_config"]}',
                                             f'--workdir={r["work"]}'],
         ['dict_config.py returns dict from get_config(), not a ConfigDict']),
    Case('config imports a missing module', lambda r: [*MAIN, f'--config={r["import_config"]}',
                                                       f'--workdir={r["work"]}'],
         ["import_config.py imports 'no_such_module_xyz', which is not installed"]),
    Case('relative config path from another directory',
         lambda r: [*MAIN, '--config=configs/default.py', f'--workdir={r["work"]}'],
         ['configs/default.py does not exist (relative to the working directory /)',
          f'e.g. --config={ROOT}/configs/default.py '], cwd='/'),
    Case('unset a key that always has a value', _main('--config.lr=None'),
         ['--config.lr=None: lr always has a value']),
    Case('unset total_steps to train by epochs',  # the unset works: the next check speaks
         _main('--config.total_steps=None', '--config.total_epochs=0.01', '--config.batch_size=12'),
         ['batch_size=12 does not split over 8 devices']),
    Case('num_classes 0', _main('--config.num_classes=0'),
         ['config.num_classes=0 is out of range', 'leave it unset']),
    Case('unknown dataset leaves no workdir', _main('--config.dataset=no_such_dataset'),
         ["unknown dataset 'no_such_dataset'"]),
    Case('export under a regular file',
         _cli('export', '--workdir={finished}', '--out={regular_file}/bundle'),
         ['regular_file/bundle (Not a directory)', 'pass a path under a directory'], absent=[]),
    Case('export into a read-only directory',
         _cli('export', '--workdir={finished}', '--out={read_only}/bundle'),
         ['cannot write', 'read_only/bundle (Read-only file system)'], absent=[]),
    Case('convert into a read-only directory',
         _cli('convert', '--checkpoint={ze_npz}', '--model=ViT-Ze/4', '--out={read_only}/x.npz'),
         ['cannot write', 'read_only/x.npz (Read-only file system)'], absent=[]),
    Case('folder dataset prepared on a full disk',
         _main('--config.dataset=folder:{colours}', '--config.data_dir={full_disk}/tfds',
               '--config.image_size=16', '--config.batch_size=8'),
         ['cannot write', 'full_disk/tfds', '(No space left on device): free space there']),
    Case('release on a read-only data_dir names where the index can go',
         _main('--config.dataset=imagenet21k', '--config.data_dir={ro_release}'),
         ['cannot write the index in', 'ro_release/vit_jax_index/imagenet21k-',
          '(Read-only file system): set $VIT_JAX_INDEX_DIR to a directory on a writable file '
          'system (the index is small; the images stay where they are)']),
    Case('launch without --', _cli('launch', '--tpu=t', '--zone=z', '--dry_run', 'python3', '-m',
                                   'vit_jax.main'),
         ["'python3' is not a flag of launch: put the command to run after --"], absent=[]),
    Case('launch --stop --status', _cli('launch', '--tpu=t', '--zone=z', '--dry_run', '--stop',
                                        '--status'),
         ['--stop with --status', 'pass --status alone'], absent=[]),
    Case('sweep with a garbage study.db', _cli('sweep', '--sweep={sweep}', '--workdir={bad_db}'),
         ['study.db is damaged or not a database (file is not a database)', 'move it away'],
         absent=[]),
    Case('sweep with a truncated study.db', _cli('sweep', '--sweep={sweep}',
                                                 '--workdir={cut_db}'),
         ['study.db is damaged or not a database (database disk image is malformed)'], absent=[]),
    Case('sweep with an unknown metric', _cli('sweep', '--sweep={metric_sweep}',
                                              '--workdir={work}'),
         ['"metric" in', "is 'top5', which no eval record has: use one of accuracy"]),
    Case('weights download fails and leaves no cache folder',
         _cli('weights', '--fetch=ViT-B/16@imagenet21k'), ['cannot download ViT-B/16@imagenet21k'],
         absent=['{tmp}/weights_cache'],
         env=lambda r: {weights.URL_VAR: f'http://127.0.0.1:{free_port()}/vit_models',
                        weights.DIR_VAR: f'{r["tmp"]}/weights_cache/sub'}),
    Case('weights of another model under a name',
         _cli('predict', '--checkpoint=ViT-B/16@imagenet21k', '{image}'),
         ['holds another model (width 32, 2 blocks), not ViT-B/16@imagenet21k (ViT-B/16: width '
          '768, 12 blocks)'], absent=[],
         env=lambda r: {weights.URL_VAR: f'file://{r["mirror"]}',
                        weights.DIR_VAR: f'{r["tmp"]}/mirror_cache'}),
]


def _study_db(path) -> None:
  """A study database with some trials, cut to a third: a truncated copy."""
  import optuna  # pylint: disable=g-import-not-at-top
  study = optuna.create_study(storage=f'sqlite:///{path}', study_name='cut')
  for i in range(30):
    study.enqueue_trial({'x': i})
  del study
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 3)


def _mount(path, options):
  os.makedirs(path, exist_ok=True)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', path], check=True)


@pytest.fixture(scope='module')
def resources(tmp_path_factory, data_dir):
  base = tmp_path_factory.mktemp('reliability_inputs')
  (base / 'dict_config.py').write_text('def get_config(arg=None):\n  return {"a": 1}\n')
  (base / 'import_config.py').write_text('import no_such_module_xyz\n'
                                         'def get_config(arg=None):\n  return None\n')
  (base / 'regular_file').write_text('a file, not a directory')
  c = mnist5k.get_config('model_name=ViT-Ze/4,steps=1,batch_size=16')
  c.data_dir, c.warmup_steps, c.progress = data_dir, 0, False
  loop.train_and_evaluate(c, str(base / 'finished'))
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  params = models.create_model('ViT-Ze/4', num_classes=10).init(
      jax.random.PRNGKey(0), np.zeros((1, 28, 28, 1), np.float32), train=False)['params']
  npz.save_npz(str(base / 'ze.npz'), params)
  mirror_file = base / 'mirror' / weights.lookup('ViT-B/16@imagenet21k').path
  mirror_file.parent.mkdir(parents=True)
  mirror_file.write_bytes((base / 'ze.npz').read_bytes())  # another model under the name
  from PIL import Image  # pylint: disable=g-import-not-at-top
  Image.fromarray(np.full((28, 28, 3), 128, np.uint8)).save(base / 'image.png')
  (base / 'bad_db').mkdir()
  (base / 'bad_db' / 'study.db').write_bytes(os.urandom(3000))
  (base / 'cut_db').mkdir()
  _study_db(base / 'cut_db' / 'study.db')
  sweep = ("def get_sweep():\n  return {'config': 'configs/mnist5k.py:model_name=ViT-Ze/4,"
           "steps=2,batch_size=32', 'grid': {'lr': [0.1]}, 'sampler': 'tpe', 'trials': 1, "
           "'ranges': {'warmup_steps': {'low': 1, 'high': 3, 'int': True}}%s}\n")
  (base / 'sweep.py').write_text(sweep % '')
  (base / 'metric_sweep.py').write_text(sweep % ", 'metric': 'top5'")
  write_colour_folder(str(base / 'colours'), per_class=4)
  mounts = [str(base / 'read_only'), str(base / 'full_disk'), str(base / 'ro_release')]
  _mount(mounts[0], 'size=1m,ro')
  _mount(mounts[1], 'size=8k')
  _mount(mounts[2], 'size=1m')  # an ImageNet-21k release on a file system then made read-only
  from PIL import Image  # pylint: disable=g-import-not-at-top
  for synset in ('n00000001', 'n00000002'):
    os.makedirs(os.path.join(mounts[2], 'imagenet21k', synset))
    for i in range(2):
      Image.fromarray(np.full((8, 8, 3), 60 * i, np.uint8)).save(
          os.path.join(mounts[2], 'imagenet21k', synset, f'{synset}_{i}.png'))
  subprocess.run(['mount', '-o', 'remount,ro', mounts[2]], check=True)
  try:
    yield dict(tmp=str(base), data_dir=data_dir, dict_config=str(base / 'dict_config.py'),
               import_config=str(base / 'import_config.py'), finished=str(base / 'finished'),
               regular_file=str(base / 'regular_file'), read_only=mounts[0],
               full_disk=mounts[1], ro_release=mounts[2], ze_npz=str(base / 'ze.npz'),
               colours=str(base / 'colours'),
               bad_db=str(base / 'bad_db'), cut_db=str(base / 'cut_db'), sweep=str(base / 'sweep.py'),
               metric_sweep=str(base / 'metric_sweep.py'), mirror=str(base / 'mirror'),
               image=str(base / 'image.png'))
  finally:
    for mount in mounts:
      subprocess.run(['umount', '-l', mount], check=False)


def _id(case: Case) -> str:
  return re.sub(r'[^A-Za-z0-9=.-]+', '_', case.name).strip('_')


def _run(case: Case, resources: dict, index: int):
  r = dict(resources, work=f'{resources["tmp"]}/work{index}')
  env = dict(os.environ, VIT_JAX_HUGEPAGES='0', **(case.env(r) if case.env else {}))
  proc = subprocess.run(case.argv(r), cwd=case.cwd or ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  return proc, [p.format(**r) for p in case.absent]


@pytest.fixture(scope='module')
def outcomes(request, resources):
  selected = {item.callspec.params['case'].name for item in request.session.items
              if item.module is sys.modules[__name__] and hasattr(item, 'callspec')
              and 'case' in item.callspec.params}
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
  futures = {case.name: pool.submit(_run, case, resources, i)
             for i, case in enumerate(CASES) if case.name in selected}
  yield futures
  pool.shutdown(wait=True)


@pytest.mark.parametrize('case', CASES, ids=[_id(case) for case in CASES])
def test_one_error_line(case, outcomes):
  proc, absent = outcomes[case.name].result()
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  problems = []
  if proc.returncode != 2:
    problems.append(f'exit status {proc.returncode}')
  if 'Traceback' in proc.stderr:
    problems.append('a traceback')
  if not lines or not lines[-1].startswith('error: '):
    problems.append('no error: line last')
  elif not all(n in lines[-1] for n in case.needles):
    problems.append(f'missing {[n for n in case.needles if n not in lines[-1]]}')
  problems += [f'{path} was left behind' for path in absent if os.path.exists(path)]
  assert not problems, f'{case.name}: {", ".join(problems)}\n{proc.stderr[-1500:]}'


# ---------------------------------------------------------------------------------------------
# Cases that need no command line.


def test_a_run_lock_that_is_a_directory_is_refused_before_training(tmp_path):
  (tmp_path / 'run.lock').mkdir()
  with pytest.raises(UserError, match=r'run.lock is not a file, and the run writes its run.lock '
                                      r'there: move it away or use another --workdir'):
    workdir_lib.check(str(tmp_path))


def gcloud_reason(stderr: str) -> str:
  return launch_tools.reason(stderr, launch.GCLOUD_MARKERS, 300)


def test_gcloud_reason_keeps_its_error_lines_whole():
  stderr = ('WARNING: ' + 'x' * 400 + '\nERROR: (gcloud.compute.tpus.tpu-vm.ssh) NOT_FOUND: '
            'Requested entity was not found.\n' + 'more detail ' * 40)
  assert gcloud_reason(stderr) == ('ERROR: (gcloud.compute.tpus.tpu-vm.ssh) NOT_FOUND: Requested '
                                   'entity was not found.')
  long = gcloud_reason('ERROR: ' + 'word ' * 100)
  assert long.endswith('word ...') and len(long) <= 304


def test_sync_dry_run_keeps_the_archive_its_commands_name(tmp_path):
  said = []
  launch.run(Plan('t', 'z'), Steps(sync=True), local_dir=ROOT, dry_run=True, say=said.append)
  archive = re.search(r'kept at (\S+)', said[0]).group(1)
  try:
    assert os.path.isfile(archive) and archive in said[1]
  finally:
    os.remove(archive)
    os.rmdir(os.path.dirname(archive))


def test_a_cut_file_in_the_weights_cache_is_downloaded_again(tmp_path, monkeypatch, capfd):
  name = 'ViT-B/16@imagenet21k'
  source = tmp_path / 'mirror' / weights.lookup(name).path
  source.parent.mkdir(parents=True)
  source.write_bytes(b'PK' + os.urandom(100))  # replaced below by a whole file
  import zipfile  # pylint: disable=g-import-not-at-top
  with zipfile.ZipFile(source, 'w') as z:
    z.writestr('a.npy', b'x' * 1000)
  monkeypatch.setenv(weights.URL_VAR, f'file://{tmp_path / "mirror"}')
  monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
  cached = weights.local_path(weights.lookup(name))
  os.makedirs(os.path.dirname(cached))
  with open(cached, 'wb') as f:
    f.write(source.read_bytes()[:50])  # a cut download kept by hand
  assert weights.fetch(name) == cached
  assert open(cached, 'rb').read() == source.read_bytes()
  assert 'is not a whole .npz file; downloading it again' in capfd.readouterr().err
