"""Train on an image folder written by the test (with a corrupt file), then predict, export and
convert: every way of loading the trained model gives the expected top class and the same
probabilities; bad input gives one-line errors."""

import dataclasses
import fcntl
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vit_jax.configs import mnist5k
from image_folder_util import image_paths, write_colour_folder, write_images
from vit_jax.serving import inference
from vit_jax.serving import bundle as bundle_lib
from vit_jax.formats import npz, timm_layout
from vit_jax.models.spec import ModelSpec, infer_image_size
from vit_jax.data import image_files, specs
from vit_jax.errors import UserError
from helpers import ROOT

# One worker runs this module, so its shared fixtures are computed once per test run.
pytestmark = pytest.mark.xdist_group('predict')

STEPS = 40


def _train(base):
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  write_colour_folder(str(base / 'colours'))
  config = mnist5k.get_config(f'model_name=ViT-Ze/4,steps={STEPS},batch_size=16,lr=3e-3')
  config.dataset = f'folder:{base / "colours"}'
  config.data_dir = str(base / 'tfds')
  config.pp.train = 'resize'
  config.pp.eval = 'central_crop'  # resize_small + central crop: predict must do the same
  config.eval_batch_size = 8
  config.warmup_steps = 5
  config.eval_every = config.checkpoint_every = config.log_every = STEPS
  config.progress = False
  result = loop.train_and_evaluate(config, str(base / 'run'))
  write_images(str(base / 'new'))
  with open(base / 'result.json', 'w') as f:
    json.dump(result, f)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A ViT-Ze/4 trained STEPS steps on the colour folder (once for all xdist workers of the
  test run: the first to take the lock trains); its workdir, eval result and fresh images."""
  base = tmp_path_factory.getbasetemp()
  base = (base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base) / 'predict_colours'
  base.mkdir(exist_ok=True)
  with open(base / 'lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (base / 'result.json').exists():
      _train(base)
  return dict(workdir=str(base / 'run'), result=json.loads((base / 'result.json').read_text()),
              images=image_paths(str(base / 'new')), base=base)


def _probabilities(results):
  return np.array([[t['probability'] for t in sorted(r['top'], key=lambda t: t['index'])]
                   for r in results])


def test_folder_run_trains_and_predict_gives_the_expected_class(run):
  assert run['result']['count'] == 3  # the 3 test images (one per class), corrupt file skipped
  bundle = bundle_lib.from_workdir(run['workdir'])
  assert bundle.class_names == ('blue', 'green', 'red')
  assert (bundle.ops, bundle.decode_channels) == ('central_crop', 3)
  paths = list(run['images'])
  results = inference.predict(bundle, paths, batch_size=2, top_k=5)  # 2 batches, last padded
  assert [r['file'] for r in results] == paths
  for r in results:
    assert len(r['top']) == 3  # top 5 of 3 classes
    assert r['top'][0]['class'] == run['images'][r['file']], r
    probs = [t['probability'] for t in r['top']]
    assert probs == sorted(probs, reverse=True) and abs(sum(probs) - 1) < 1e-5
  # The numbers are the model's on the eval preprocessing (here resize_small + central crop).
  images = image_files.load(
      paths, specs.eval_spec('central_crop(resize=28)', 28), 3)
  assert images.shape == (3, 28, 28, 3)
  logits = np.asarray(bundle.spec.build().apply({'params': bundle.params}, images, train=False),
                      np.float64)
  softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(_probabilities(results), softmax, atol=1e-6)
  sigmoid = inference.predict(dataclasses.replace(bundle, output='sigmoid'), paths, batch_size=8)
  np.testing.assert_allclose(_probabilities(sigmoid), 1 / (1 + np.exp(-logits)), atol=1e-6)


def test_bundle_and_converted_files_predict_the_same(run, tmp_path):
  paths = list(run['images'])
  want = _probabilities(inference.predict(bundle_lib.from_workdir(run['workdir']), paths))

  bundle_lib.save(bundle_lib.from_workdir(run['workdir']), str(tmp_path / 'bundle'))
  assert sorted(os.listdir(tmp_path / 'bundle')) == ['model.json', 'params.npz']
  meta = json.loads((tmp_path / 'bundle' / 'model.json').read_text())
  assert (meta['model_name'], meta['image_size'], meta['channels']) == ('ViT-Ze/4', 28, 3)
  assert meta['class_names'] == ['blue', 'green', 'red']
  assert npz.read_npz(str(tmp_path / 'bundle' / 'params.npz'))[1] == 'released'
  loaded = bundle_lib.load(str(tmp_path / 'bundle'))
  np.testing.assert_allclose(_probabilities(inference.predict(loaded, paths)), want, atol=1e-6)

  path = str(tmp_path / 'm.safetensors')
  timm_layout.save_safetensors(path, loaded.params, spec=loaded.spec,
                               class_names=loaded.class_names)
  from_file = bundle_lib.from_params_file(path)
  assert from_file.spec == loaded.spec and from_file.class_names == loaded.class_names
  # A params file carries no preprocessing: it gets the original fine-tuning's eval resize.
  assert from_file.ops == 'resize'
  from_file.ops = loaded.ops
  np.testing.assert_allclose(_probabilities(inference.predict(from_file, paths)), want, atol=1e-6)

  plain = bundle_lib.from_params_file(str(tmp_path / 'bundle' / 'params.npz'),
                                      model_name='ViT-Ze/4')
  assert plain.spec.image_size == 28 and plain.class_names == ('0', '1', '2')


def test_cli_export_then_predict_json(run, tmp_path):
  out = tmp_path / 'bundle'
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'export', f'--workdir={run["workdir"]}',
                         f'--out={out}', '--format=savedmodel,stablehlo'], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  assert [line.split(' (logits checked: relative error ')[0] for line in lines] == [
      f'wrote {out}: ViT-Ze/4, 3 classes, 28x28x3',
      f'wrote {out / "saved_model"}: TensorFlow SavedModel, serving_default: images uint8 '
      '[batch, 28, 28, 3] -> probabilities',
      f'wrote {out / "model.stablehlo"}: StableHLO for jax.export.deserialize: images uint8 '
      '[batch, 28, 28, 3] -> (probabilities, logits)']
  assert all(float(line.split('relative error ')[1].rstrip(')')) <= 1e-5 for line in lines[1:])
  _check_saved_model_with_tensorflow_alone(out, run, tmp_path)
  paths = list(run['images'])
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'predict', f'--bundle={out}', '--json',
                         '--top_k=2', *paths], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr
  results = json.loads(proc.stdout)
  assert [r['file'] for r in results] == paths
  assert [r['top'][0]['class'] for r in results] == [run['images'][p] for p in paths]
  assert all(len(r['top']) == 2 for r in results)


# Run by a Python where jax, flax and vit_jax cannot be imported (TensorFlow imports jax when it
# is installed, if it can: blocked here, it must do without).
TF_ONLY = '''
import sys
class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in ('jax', 'jaxlib', 'flax', 'vit_jax'):
      raise ImportError(f'{name} is blocked: TensorFlow alone must serve the model')
sys.meta_path.insert(0, Block())
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = loaded.signatures['serving_default'](images=tf.constant(np.load(sys.argv[2])))
np.savez(sys.argv[3], **{k: v.numpy() for k, v in out.items()})
assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'vit_jax')]
'''


def _check_saved_model_with_tensorflow_alone(out, run, tmp_path):
  """The SavedModel, loaded by TensorFlow alone, gives our probabilities and logits for the
  fresh images (as uint8 at the model's size) and the classes predict gives."""
  bundle = bundle_lib.load(str(out))
  spec = bundle.eval_spec()
  paths = list(run['images'])
  floats = np.stack([image_files.load_one(p, spec, bundle.decode_channels) for p in paths])
  pixels = np.clip(np.round(floats * 127.5 + 127.5), 0, 255).astype(np.uint8)
  np.save(tmp_path / 'pixels.npy', pixels)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  proc = subprocess.run([sys.executable, '-c', TF_ONLY, str(out / 'saved_model'),
                         str(tmp_path / 'pixels.npy'), str(tmp_path / 'tf_out.npz')],
                        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  got = np.load(tmp_path / 'tf_out.npz')
  x = (pixels.astype(np.float32) - 127.5) / 127.5
  logits = np.asarray(bundle.spec.build().apply({'params': bundle.params}, x, train=False))
  np.testing.assert_allclose(got['logits'], logits, rtol=1e-5, atol=1e-5)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  np.testing.assert_allclose(got['probabilities'], e / e.sum(-1, keepdims=True), rtol=1e-5,
                             atol=1e-6)
  assert [bundle.class_names[i] for i in got['probabilities'].argmax(-1)] == \
      [run['images'][p] for p in paths]


def test_user_errors(run, tmp_path):
  with pytest.raises(UserError, match='no model given'):
    bundle_lib.resolve()
  with pytest.raises(UserError, match='not a bundle'):
    bundle_lib.resolve(bundle=str(tmp_path))
  with pytest.raises(UserError, match='holds params only: pass the model'):
    params_file = str(tmp_path / 'p.npz')
    npz.save_npz(params_file, bundle_lib.from_workdir(run['workdir']).params)
    bundle_lib.resolve(checkpoint=params_file)
  with pytest.raises(UserError, match=r'checkpoint does not fit ViT-Mu/4'):
    bundle_lib.resolve(checkpoint=params_file, model='ViT-Mu/4')
  with pytest.raises(UserError, match='apply to a params file'):
    bundle_lib.resolve(workdir=run['workdir'], model='ViT-B/16')
  (tmp_path / 'names.txt').write_text('a\nb\n')
  with pytest.raises(UserError, match='2 names for a model with 3 classes'):
    bundle_lib.resolve(workdir=run['workdir'], class_names=str(tmp_path / 'names.txt'))
  (tmp_path / 'keep').mkdir()
  (tmp_path / 'keep' / 'notes.txt').write_text('mine')
  with pytest.raises(UserError, match='non-empty directory that is not a bundle'):
    bundle_lib.save(bundle_lib.from_workdir(run['workdir']), str(tmp_path / 'keep'))
  assert os.listdir(tmp_path / 'keep') == ['notes.txt']
  trained = bundle_lib.from_workdir(run['workdir'])
  with pytest.raises(UserError, match='no images given'):
    inference.predict(trained, [])
  paths = [list(run['images'])[0], str(tmp_path / 'missing.png'),
           str(run['base'] / 'colours' / 'red' / 'broken.jpg'), str(tmp_path / 'names.txt')]
  with pytest.raises(UserError) as e:
    inference.predict(trained, paths, batch_size=2)
  assert str(e.value) == (f'cannot read image {paths[1]}: no such file; pass PNG or JPEG files '
                          f'(and 2 more: {paths[2]}, {paths[3]}); nothing was printed: remove or '
                          'fix these files')


@pytest.mark.parametrize('kind', ['non_utf8_name', 'dangling_symlink', 'symlink_loop'])
def test_predict_odd_file_names(run, tmp_path, kind):
  """A file name that is not valid UTF-8 is read, and comes back from the JSON output as its own
  bytes (a name literally spelled with a backslash stays another name); the text output shows
  it with backslash escapes. A dangling link or a link loop is one line naming it."""
  trained = bundle_lib.from_workdir(run['workdir'])
  good = list(run['images'])[0]
  if kind == 'non_utf8_name':
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b'/caf\xe9.png')
    with open(good, 'rb') as src, open(odd, 'wb') as dst:
      dst.write(src.read())
    spelled = str(tmp_path / 'caf\\xe9.png')  # spelled with a backslash, valid UTF-8
    with open(good, 'rb') as src, open(spelled, 'wb') as dst:
      dst.write(src.read())
    results = inference.predict(trained, [odd, spelled, good])
    back = json.loads(json.dumps(results))
    assert [os.fsencode(r['file']) for r in back] == [os.fsencode(odd), os.fsencode(spelled),
                                                      os.fsencode(good)]
    assert back[0]['file'] != back[1]['file']
    shown = inference.format_text(results).splitlines()
    assert shown[0] == f'{tmp_path}/caf\\xe9.png'
    assert shown[len(results[0]['top']) + 1] == f'{tmp_path}/caf\\\\xe9.png'  # the backslash doubled
    assert results[0]['top'] == results[2]['top']  # the same bytes, the same prediction
    return
  odd = str(tmp_path / 'link.png')
  if kind == 'dangling_symlink':
    os.symlink(str(tmp_path / 'gone.png'), odd)
    reason = 'no such file'
  else:
    os.symlink(odd, odd)
    reason = 'Too many levels of symbolic links'
  with pytest.raises(UserError, match=f'^cannot read image {odd}: {reason}; pass PNG or JPEG '
                                      'files; nothing was printed'):
    inference.predict(trained, [odd, good])


def test_text_output_keeps_each_name_on_its_line():
  """Control characters of a file or class name (a newline, a terminal escape) and bytes that
  are not UTF-8 are backslash escapes in the text output; the JSON output keeps them as they
  are."""
  results = [{'file': 'a\nb.png', 'top': [
      {'class': 'red\nwine', 'index': 1, 'probability': 0.75},
      {'class': '\x1b[31mcaf\udce9 \u00e9', 'index': 0, 'probability': 0.25}]}]
  assert inference.format_text(results).splitlines() == [
      'a\\nb.png', '  0.7500  red\\nwine', '  0.2500  \\x1b[31mcaf\\xe9 \u00e9']
  assert inference.one_line('a\\nb') == 'a\\\\nb'  # a backslash of the name, not a newline
  assert json.loads(json.dumps(results)) == results


def test_image_size_is_inferred_from_the_position_embedding():
  import jax  # pylint: disable=g-import-not-at-top
  for name, size in (('ViT-B/16', 384), ('R+ViT-Ti/16', 224), ('R50+ViT-B/16', 224)):
    model = ModelSpec(name, 5, {}, size, 3).build()
    x = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
    params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
    assert infer_image_size(params['params'], name) == size, name


def test_predict_beside_a_run_that_removes_each_checkpoint_as_it_saves_the_next(tmp_path,
                                                                                 data_dir):
  """A real run keeping one checkpoint and saving every step: reading its newest step races
  with its removal. Every read in process gives a whole bundle or the one-line error, and the
  command line the same (its exit 0, or 2 with one line; never a traceback)."""
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from helpers import xla_flags  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'live'
  trainer = subprocess.Popen(
      [sys.executable, '-m', 'vit_jax.main',
       '--config=configs/default.py:model_name=ViT-Ze/4,steps=5000,batch_size=16',
       '--config.warmup_steps=1', '--config.progress=False', f'--workdir={workdir}',
       f'--config.data_dir={data_dir}', '--config.checkpoint_every=1',
       '--config.keep_checkpoints=1', '--config.eval_every=100000'],
      cwd=ROOT, env=dict(os.environ, XLA_FLAGS=xla_flags(1), VIT_JAX_HUGEPAGES='0'),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 300
    while not (workdir / 'checkpoints').is_dir() or not any(
        n.isdigit() for n in os.listdir(workdir / 'checkpoints')):
      assert trainer.poll() is None and time.monotonic() < deadline, trainer.stderr.read()
      time.sleep(0.1)
    read = 0
    for _ in range(6):
      try:
        bundle = bundle_lib.from_workdir(str(workdir))
      except UserError as e:
        assert str(e).startswith(f'the newest checkpoint in {workdir}/checkpoints was removed '
                                 'while it was read, 10 times in a row'), e
        continue
      assert bundle.spec.model_name == 'ViT-Ze/4' and bundle.params['head']['kernel'].shape == (
          32, 10)
      read += 1
    image = tmp_path / 'gray.png'
    from PIL import Image  # pylint: disable=g-import-not-at-top
    Image.fromarray(np.full((28, 28), 128, np.uint8)).save(image)
    proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'predict', f'--workdir={workdir}',
                           str(image)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert (proc.returncode == 0 and proc.stdout.startswith(str(image))) or (
        proc.returncode == 2 and len(lines) == 1 and 'removed while it was read' in lines[0]), \
        proc.stderr[-3000:]
    assert trainer.poll() is None  # the run went on throughout
    assert read >= 1, 'no read in process succeeded'
  finally:
    trainer.send_signal(signal.SIGTERM)
    trainer.communicate(timeout=300)
