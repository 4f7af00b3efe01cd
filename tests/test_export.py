"""Deployment exports (vit_jax/serving/stablehlo.py, onnx.py, exported.py, formats.py): a small
ViT exported to StableHLO and ONNX runs at batch 1 and 7 outside this project, with the JAX
model's logits; a wrong export or format name is one UserError."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.errors import UserError
from vit_jax.models.spec import ModelSpec
from vit_jax.serving import exported
from vit_jax.serving import formats
from vit_jax.serving import onnx as onnx_export
from vit_jax.serving import stablehlo
from vit_jax.serving.bundle import Bundle

# The two batches every export is run at: one image, and an odd batch that no trace used.
BATCHES = (1, 7)
# Max |export - JAX| / max |JAX logit| required here; exported.TOLERANCE is the export's own check.
EXACT = 1e-5


def tiny_bundle(model_name='ViT-Ze/4', options=None, image_size=28) -> Bundle:
  """A small model whose params are all moved off their initial values (the head is born zero)."""
  spec = ModelSpec(model_name, 5, dict(options or {}), image_size, 3)
  model = spec.build()
  params = model.init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)),
                      train=False)['params']
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  leaves = [np.asarray(p + 0.05 * jax.random.normal(k, p.shape)) for p, k in zip(leaves, keys)]
  return Bundle(spec=spec, params=jax.tree.unflatten(tree, leaves),
                class_names=tuple('abcde'))


def jax_logits(bundle, images):
  return np.asarray(jax.jit(exported.predict_fn(bundle))(bundle.params, images)[1])


@pytest.fixture(scope='module')
def bundle():
  return tiny_bundle()


@pytest.fixture(scope='module')
def images(bundle):
  return exported.check_images(bundle, max(BATCHES))


# Run by a Python where flax and vit_jax cannot be imported: jax and numpy alone run the file.
JAX_ONLY = '''
import sys
class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in ('flax', 'vit_jax', 'tensorflow'):
      raise ImportError(f'{name} is blocked: jax alone must run the export')
sys.meta_path.insert(0, Block())
import jax
import numpy as np
with open(sys.argv[1], 'rb') as f:
  exp = jax.export.deserialize(bytearray(f.read()))
images = np.load(sys.argv[2])
out = {}
for b in map(int, sys.argv[4:]):
  probabilities, logits = exp.call(images[:b])
  out[f'logits{b}'], out[f'probabilities{b}'] = np.asarray(logits), np.asarray(probabilities)
np.savez(sys.argv[3], **out)
'''


def test_stablehlo_export_runs_with_jax_alone_at_any_batch(bundle, images, tmp_path):
  path = str(tmp_path / stablehlo.FILENAME)
  assert stablehlo.save(bundle, path) <= EXACT
  np.save(tmp_path / 'images.npy', images)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  proc = subprocess.run([sys.executable, '-c', JAX_ONLY, path, str(tmp_path / 'images.npy'),
                         str(tmp_path / 'out.npz'), *map(str, BATCHES)], cwd=str(tmp_path),
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  got = np.load(tmp_path / 'out.npz')
  want = jax_logits(bundle, images)
  for b in BATCHES:
    assert got[f'logits{b}'].shape == (b, 5)
    error = exported.relative_error(got[f'logits{b}'], want[:b])
    print(f'StableHLO batch {b}: relative error {error:.2e}')
    assert error <= EXACT
    np.testing.assert_allclose(got[f'probabilities{b}'].sum(-1), 1, rtol=1e-5)


def test_onnx_export_runs_in_onnxruntime_at_any_batch(bundle, images, tmp_path):
  path = str(tmp_path / onnx_export.FILENAME)
  assert onnx_export.save(bundle, path) <= EXACT
  runtime = onnx_export.runtime(path)
  (given,) = runtime.get_inputs()
  assert (given.name, given.type, given.shape) == ('images', 'tensor(uint8)', ['batch', 28, 28, 3])
  want = jax_logits(bundle, images)
  for b in BATCHES:
    probabilities, logits = runtime.run(['probabilities', 'logits'], {'images': images[:b]})
    error = exported.relative_error(logits, want[:b])
    print(f'ONNX batch {b}: relative error {error:.2e}')
    assert logits.shape == (b, 5) and error <= EXACT
    np.testing.assert_allclose(probabilities.sum(-1), 1, rtol=1e-5)


def test_an_export_with_other_logits_is_refused(bundle):
  with pytest.raises(UserError, match=r'the ONNX export x gives other logits than the JAX model '
                                      r'\(relative error 0.5 > 0.0001\)'):
    exported.check(bundle, lambda x: 0.5 * jax_logits(bundle, x), 'the ONNX export x')
  with pytest.raises(UserError, match=r'the ONNX export x does not run \(RuntimeError: boom\)'):
    exported.check(bundle, lambda x: (_ for _ in ()).throw(RuntimeError('boom')),
                   'the ONNX export x')


def test_format_names():
  assert formats.check(['onnx', 'stablehlo', 'onnx']) == ('onnx', 'stablehlo')
  assert formats.check([]) == ()
  with pytest.raises(UserError, match=r'--format=tflite is not an export format: use savedmodel '
                                      r'or stablehlo or onnx'):
    formats.check(['onnx', 'tflite'])


def test_a_mixer_exports_as_a_vit_does(tmp_path):
  bundle = tiny_bundle('Mixer-Ze/4')
  path = str(tmp_path / stablehlo.FILENAME)
  assert stablehlo.save(bundle, path) <= EXACT
  images = exported.check_images(bundle, 2)
  np.testing.assert_allclose(stablehlo.load_and_run(path, images)[1], jax_logits(bundle, images),
                             rtol=0, atol=EXACT * np.abs(jax_logits(bundle, images)).max())
