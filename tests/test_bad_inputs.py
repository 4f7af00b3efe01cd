"""The bad-input catalogue: each mistake, through the real command line, gives a non-zero exit, one
`error:` line on stderr that says what is wrong and how to fix it, no traceback, and leaves what
was already in the workdir untouched. Each case is its own test; the selected cases run as
concurrent subprocesses (4 at a time, started when the first of them runs: the module is one
xdist group, so they run on one worker). Cases that need no command line are in
test_bad_inputs_library.py."""

import concurrent.futures
import dataclasses
import hashlib
import os
import re
import subprocess
import sys
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest
from PIL import Image
from helpers import ROOT, free_port
import test_hints

pytestmark = pytest.mark.xdist_group('bad_input_catalogue')  # one worker runs the process pool

MAIN = [sys.executable, '-m', 'vit_jax.main']
TINY = '--config=configs/default.py:model_name=ViT-Ze/4,steps=6,batch_size=16'


@dataclasses.dataclass
class Case:
  name: str                           # also the test id (spaces and ':' become '_')
  argv: Callable[[dict], List[str]]   # resources -> command line
  needles: List[str]                  # all must appear in the error line
  last_line_only: bool = False        # the run had started: earlier progress lines are fine
  env: Optional[Callable[[dict], Dict[str, str]]] = None


def _main(*args):
  return lambda r: [*MAIN, TINY, f'--workdir={r["workdir"]}', f'--config.data_dir={r["data_dir"]}',
                    '--config.warmup_steps=1', *args]


def _cli(command, *args):
  return lambda r: [sys.executable, '-m', 'vit_jax', command, *(a.format(**r) for a in args)]


def _config_file(path):
  return lambda r: [*MAIN, f'--config={path.format(**r)}', f'--workdir={r["workdir"]}']


CASES = [
    # vit_jax.main: model, data and config mistakes.
    Case('unknown variant', _main('--config.model_name=ViT-Q/16'),
         ["unknown model 'ViT-Q/16'", 'ViT-B/16']),
    Case('unknown dataset', _main('--config.dataset=no_such_dataset'),
         ["unknown dataset 'no_such_dataset'", 'tfds.list_builders']),
    Case('tfds data not prepared', _main('--config.dataset=cifar10'),
         ["dataset 'cifar10' is not prepared", 'tfds build cifar10']),
    Case('malformed config argument',
         lambda r: [*MAIN, '--config=configs/default.py:steps', f'--workdir={r["workdir"]}'],
         ["config argument 'steps' is not key=value"]),
    Case('unknown config key', _main('--config.no_such_key=1'),
         ['unknown config key in --config.no_such_key=1', 'configs/README.md']),
    Case('override key from another codebase', _main('--config.learning_rate=0.1'),
         ['unknown config key in --config.learning_rate=0.1', 'did you mean lr?']),
    Case('mistyped override key', _main('--config.batchsize=16'),
         ['unknown config key in --config.batchsize=16', 'did you mean batch_size']),
    Case('mistyped override value', _main('--config.lr=fast'), ['lr', 'fast']),
    Case('missing workdir', lambda r: [*MAIN, TINY], ['missing --workdir']),
    Case('batch not divisible by devices', _main('--config.batch_size=12'),
         ['batch_size=12 does not split over 8 devices', '--config.batch_size=8']),
    Case('batch not divisible by accumulation', _main('--config.accum_steps=3'),
         ['per-device batch 2 does not split into accum_steps=3']),
    Case('zero steps', _main('--config.total_steps=0'),
         ['--config.total_steps=0 is out of range', '>= 1']),
    Case('negative lr', _main('--config.lr=-0.1'), ['--config.lr=-0.1 is out of range', '> 0']),
    Case('unknown preprocessing op', _main('--config.pp.train=pad_crop(pad=2)|flp'),
         ["unknown preprocessing op 'flp' in --config.pp.train: use one of central_crop",
          'register one: docs/data.md']),
    Case('unknown evaluator', _main('--config.evals.knn.type=knm'),
         ["unknown evaluator type 'knm' in --config.evals.knn.type: use one of fewshot, knn, "
          'linear_probe, real, robustness, top1', 'docs/evaluation.md']),
    Case('image size not divisible by patch', _main('--config.image_size=30'),
         ['image size 30 is not divisible by the patch size 4', 'use a multiple of 4']),
    Case('fp8 on a CPU', _main('--config.model.fp8=True'),
         ['--config.model.fp8=True needs an NVIDIA GPU with fp8 tensor cores', 'cpu has no fp8',
          'set --config.model.fp8=False']),
    Case('unwritable workdir',
         lambda r: [*MAIN, TINY, '--workdir=/proc/no_such/dir', f'--config.data_dir={r["data_dir"]}',
                    '--config.warmup_steps=1'],
         ['cannot create --workdir=/proc/no_such/dir', 'writable directory']),
    Case('coordinator unreachable',
         _main('--num_processes=2', '--process_id=1', '--distributed_timeout=3',
               '--coordinator_address=127.0.0.1:{port}'),
         ['distributed runtime did not start within 3 s', 'start the same command on all 2']),
    Case('full disk during a checkpoint',
         lambda r: [sys.executable, 'tests/tools/full_disk_main.py', TINY,
                    f'--workdir={r["workdir"]}', f'--config.data_dir={r["data_dir"]}',
                    '--config.warmup_steps=1', '--config.checkpoint_every=2',
                    '--config.progress=False'],
         ['cannot write a checkpoint', 'No space left on device',
          'resume from the checkpoint of step 2'],
         last_line_only=True, env=lambda r: {'FULL_DISK_FROM_STEP': '4'}),
    Case('missing init checkpoint', _main('--config.init={tmp}/no_such_run'),
         ['no_such_run']),
    Case('init from a checkpoint of another model',
         _main('--config.model_name=ViT-Mu/4', '--config.init={ze_npz}'), ['ze.npz']),
    Case('init by name from a mirror serving another model',  # a Ze/4 file that would fit
         _main('--config.init=ViT-B/16@imagenet21k'),
         ['mirror_cache/imagenet21k/ViT-B_16.npz holds another model (width 32, 2 blocks), not '
          'ViT-B/16@imagenet21k (ViT-B/16: width 768, 12 blocks): delete it and fix the mirror'],
         env=lambda r: {'VIT_JAX_WEIGHTS_URL': f'file://{r["mirror"]}',
                        'VIT_JAX_WEIGHTS_DIR': f'{r["tmp"]}/mirror_cache'}),
    Case('init of an RGB run into a 1-channel run', _main('--config.init={ze_rgb_npz}'),
         ['--config.init=', 'ze_rgb.npz was trained on 3-channel images and this run feeds '
          '1-channel ones: end --config.pp.train and --config.pp.eval with channels(3)']),
    # Image folders.
    Case('image folder empty', _main('--config.dataset=folder:{empty_folder}'), ['empty_folder']),
    Case('image folder with one class', _main('--config.dataset=folder:{one_class_folder}'),
         ['one_class_folder', 'class']),
    Case('image folder with only corrupt files',
         _main('--config.dataset=folder:{corrupt_folder}'), ['corrupt_folder']),
    # predict, convert, export, analyze, sweep, launch (python -m vit_jax <command>).
    Case('predict: missing checkpoint',
         _cli('predict', '--checkpoint={tmp}/missing.npz', '--model=ViT-Ze/4',
              '{image}'), ['missing.npz']),
    Case('predict: truncated checkpoint',
         _cli('predict', '--checkpoint={truncated_npz}', '--model=ViT-Ze/4', '{image}'),
         ['truncated.npz']),
    Case('predict: checkpoint of another model',
         _cli('predict', '--checkpoint={ze_npz}', '--model=ViT-Mu/4', '{image}'),
         ['ze.npz']),
    Case('predict: a non-image file',
         _cli('predict', '--checkpoint={ze_npz}', '--model=ViT-Ze/4',
              '--image_size=28', '{text_file}'), ['notes.txt']),
    Case('convert: not an npz', _cli('convert', '--checkpoint={text_file}',
                                     '--model=ViT-Ze/4', '--out={tmp}/out.safetensors'),
         ['--checkpoint=', 'notes.txt is neither a params file']),
    Case('convert: out under a regular file',
         _cli('convert', '--checkpoint={ze_npz}', '--out={text_file}/x.npz'),
         ['cannot save', 'notes.txt/x.npz:', 'notes.txt is a file, not a directory: pass a path '
          'under a directory']),
    Case('bench: unknown config key', _cli('bench', '--config.no_such_key=1', '--model=ViT-Ze/4'),
         ['unknown config key in --config.no_such_key=1', 'configs/README.md']),
    Case('bench: mistyped nested config key',
         _cli('bench', '--config.model.remats=full', '--model=ViT-Ze/4'),
         ['unknown config key in --config.model.remats=full', 'did you mean model.remat']),
    Case('bench: two compute dtypes',
         _cli('bench', '--dtype=float32', '--config.model.dtype=bfloat16', '--model=ViT-Ze/4'),
         ['--dtype=float32 and --config.model.dtype=bfloat16 disagree: pass one of them']),
    Case('export: workdir without checkpoints',
         _cli('export', '--workdir={workdir}', '--out={tmp}/bundle'), ['checkpoints']),
    Case('export: unknown format',
         _cli('export', '--workdir={workdir}', '--out={tmp}/bundle', '--format=onnx,tflite'),
         ['--format=tflite is not an export format: use savedmodel or stablehlo or onnx']),
    Case('analyze: workdir without checkpoints',
         _cli('analyze', '--workdir={workdir}', '--out={tmp}/figures'),
         ['no checkpoints in']),
    Case('evaluate: no checkpoint', _cli('evaluate', '--workdir={workdir}', '--evals=knn'),
         ['no checkpoints in', 'train first']),
    Case('evaluate: bad step', _cli('evaluate', '--workdir={workdir}', '--step=last',
                                    '--evals=knn'),
         ['--step=last is not a step number', 'leave it out for the newest']),
    Case('sweep: spec file missing', _cli('sweep', '--sweep={tmp}/none.py',
                                          '--workdir={workdir}'), ['none.py is not a file']),
    Case('sweep: spec with an unknown key', _cli('sweep', '--sweep={bad_sweep}',
                                                 '--workdir={workdir}', '--dry_run'),
         ['unknown key(s) grd']),
    Case('launch: no command', _cli('launch', '--tpu=t', '--zone=z', '--dry_run'),
         ['no command to run']),
    Case('weights: unknown name', _cli('weights', '--fetch=ViT-B/16@jft'),
         ["unknown weights 'ViT-B/16@jft'", 'ViT-B/16@imagenet21k', 'python -m vit_jax weights']),
    Case('predict: a size the patch does not divide',
         _cli('predict', '--checkpoint={ze_npz}', '--model=ViT-Ze/4', '--image_size=30',
              '{image}'),
         ["--image_size=30 is not a multiple of the model's 4-pixel patches"]),
    # Config files that cannot be loaded.
    Case('config file missing', _config_file('{tmp}/no_such_config.py'),
         ['the --config file', 'no_such_config.py does not exist', 'configs/default.py']),
    Case('config file with a syntax error', _config_file('{syntax_config}'),
         ['syntax_error.py is not valid Python (', 'line 2): fix it there']),
    Case('config path is a directory', _config_file('{tmp}'),
         ['is not a file', 'pass --config=<file.py>']),
    Case('config file without get_config', _config_file('{no_get_config}'),
         ['no_get_config.py defines no get_config()', 'configs/default.py']),
    Case('sweep: --parallel=0', _cli('sweep', '--sweep={bad_sweep}', '--workdir={workdir}',
                                     '--parallel=0'),
         ['--parallel=0: the number of runs at once must be at least 1']),
    Case('sweep: negative --parallel', _cli('sweep', '--sweep={bad_sweep}',
                                            '--workdir={workdir}', '--parallel=-2'),
         ['--parallel=-2: the number of runs at once must be at least 1']),
]


def _png(path, color):
  Image.fromarray(np.full((8, 8, 3), color, np.uint8)).save(path)


@pytest.fixture(scope='module')
def resources(tmp_path_factory, data_dir):
  base = tmp_path_factory.mktemp('bad_inputs')
  empty = base / 'empty_folder'
  empty.mkdir()
  one = base / 'one_class_folder' / 'cat'
  one.mkdir(parents=True)
  _png(one / 'a.png', 10)
  _png(one / 'b.png', 20)
  corrupt = base / 'corrupt_folder'
  for name in ('cat', 'dog'):
    (corrupt / name).mkdir(parents=True)
    (corrupt / name / 'x.jpg').write_bytes(b'not a jpeg at all')
  image = base / 'digit.png'
  _png(image, 128)
  text = base / 'notes.txt'
  text.write_text('not an image\n')

  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.formats import npz  # pylint: disable=g-import-not-at-top
  model = models.create_model('ViT-Ze/4', num_classes=10)
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 28, 28, 1), np.float32),
                      train=False)['params']
  ze = base / 'ze.npz'
  npz.save_npz(str(ze), params)
  mirror = base / 'mirror' / 'imagenet21k'  # a mirror that serves ze.npz as ViT-B/16's file
  mirror.mkdir(parents=True)
  (mirror / 'ViT-B_16.npz').write_bytes(ze.read_bytes())
  rgb = model.init(jax.random.PRNGKey(0), np.zeros((1, 28, 28, 3), np.float32),
                   train=False)['params']
  ze_rgb = base / 'ze_rgb.npz'
  npz.save_npz(str(ze_rgb), rgb)
  truncated = base / 'truncated.npz'
  truncated.write_bytes(ze.read_bytes()[:ze.stat().st_size // 2])
  bad_sweep = base / 'bad_sweep.py'
  bad_sweep.write_text('def get_sweep():\n  return {"config": "configs/default.py", "grd": {}}\n')
  syntax = base / 'syntax_error.py'
  syntax.write_text('def get_config(arg=None):\n  return {1: }\n')
  no_get = base / 'no_get_config.py'
  no_get.write_text('def get_conf():\n  return None\n')
  return dict(data_dir=data_dir, tmp=str(base), bad_sweep=str(bad_sweep), empty_folder=str(empty),
              syntax_config=str(syntax), no_get_config=str(no_get),
              one_class_folder=str(one.parent), corrupt_folder=str(corrupt), image=str(image),
              text_file=str(text), ze_npz=str(ze), truncated_npz=str(truncated),
              mirror=str(base / 'mirror'), ze_rgb_npz=str(ze_rgb))


def _snapshot(directory) -> Dict[str, str]:
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _run(case: Case, resources: dict, workdir) -> tuple:
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('keep me')
  (workdir / 'old_run').mkdir()
  (workdir / 'old_run' / 'result.json').write_text('{"accuracy": 0.9}')
  before = _snapshot(workdir)
  r = dict(resources, workdir=str(workdir), port=free_port())
  argv = [a.format(**r) for a in case.argv(r)]
  env = dict(os.environ, **(case.env(r) if case.env else {}))
  proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  return proc, before, _snapshot(workdir)


def _id(case: Case) -> str:
  return re.sub(r'[^A-Za-z0-9=.-]+', '_', case.name).strip('_')


@pytest.fixture(scope='module')
def outcomes(request, tmp_path_factory, resources):
  """{case name: future of (process, workdir before, workdir after)} for the selected cases."""
  selected = {item.callspec.params['case'].name for item in request.session.items
              if item.module is sys.modules[__name__] and hasattr(item, 'callspec')
              and 'case' in item.callspec.params}
  base = tmp_path_factory.mktemp('cases')
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
  futures = {case.name: pool.submit(_run, case, resources, base / f'work{i}')
             for i, case in enumerate(CASES) if case.name in selected}
  yield futures
  pool.shutdown(wait=True)


def test_catalogue_size():
  assert len(CASES) >= 20
  assert len({_id(case) for case in CASES}) == len(CASES)


def _command_of(argv) -> Optional[str]:
  """The vit_jax command a case runs (None for a script)."""
  argv = [str(a) for a in argv]
  if argv[1:3] == ['-m', 'vit_jax.main']:
    return 'train'
  return argv[3] if argv[1:3] == ['-m', 'vit_jax'] and len(argv) > 3 else None


@pytest.mark.parametrize('case', CASES, ids=[_id(case) for case in CASES])
def test_bad_input(case, outcomes):
  proc, before, after = outcomes[case.name].result()
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  problems = []
  if proc.returncode == 0:
    problems.append('exit status 0')
  if 'Traceback' in proc.stderr:
    problems.append('a traceback')
  if not lines or not lines[-1].startswith('error: '):
    problems.append('no error: line last')
  elif not case.last_line_only and len(lines) != 1:
    problems.append(f'{len(lines)} lines')
  elif not all(n in lines[-1] for n in case.needles):
    problems.append(f'missing {[n for n in case.needles if n not in lines[-1]]}')
  elif _command_of(proc.args):  # every flag the line names is one its command has
    problems += [f'names {f}' for f in test_hints.unknown_flags(_command_of(proc.args), lines[-1])]
  if any(after.get(path) != digest for path, digest in before.items()):
    problems.append('workdir contents changed')
  assert not problems, f'{case.name}: {", ".join(problems)}\n{proc.stderr[-800:]}'
