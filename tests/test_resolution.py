"""Any resolution: predict, bundles and the analyses run a model at another image size with its
position embedding resized on the fly, giving the same logits as the model `config.init` transfers
to that size (models/posemb_resize.py, the one interpolation)."""

import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax.configs import mnist5k
from vit_jax import analysis
from vit_jax.checkpoint import train_ckpt
from vit_jax.data import image_files
from vit_jax.errors import UserError
from vit_jax.formats import npz
from vit_jax.models import create_model, token_grid
from vit_jax.serving import bundle as bundle_lib
from vit_jax.serving import inference
from vit_jax.train import transfer

NAME, CLASSES = 'ViT-Ze/4', 3


def _params(size=28, seed=0):
  """ViT-Ze/4 params (1 channel) with a random head, so that logits depend on everything."""
  model = create_model(NAME, num_classes=CLASSES)
  params = jax.jit(lambda k: model.init(k, np.zeros((1, size, size, 1)), train=False))(
      jax.random.key(seed))['params']
  params = jax.tree.map(np.asarray, params)
  rng = np.random.default_rng(seed)
  params['head'] = {'kernel': rng.normal(0, 0.2, params['head']['kernel'].shape).astype(np.float32),
                    'bias': rng.normal(0, 0.2, (CLASSES,)).astype(np.float32)}
  return params


def _logits(spec, params, x):
  return np.asarray(spec.build().apply({'params': params}, x, train=False))


@pytest.mark.slow
def test_a_params_file_at_56_px_equals_its_config_init_transfer(tmp_path):
  path = str(tmp_path / 'ze.npz')
  npz.save_npz(path, _params())
  bundle = bundle_lib.from_params_file(path, model_name=NAME, image_size=56)
  assert bundle.spec.image_size == 56 and bundle.source['resized_from'] == 28
  posemb = bundle.params['Transformer']['posembed_input']['pos_embedding']
  assert posemb.shape == (1, 1 + 14 * 14, 32)

  # What config.init does for a 56-px run: every parameter from the file, the posemb resized
  # (the head it re-initialises for the new task; here it is the file's, to compare logits).
  model = create_model(NAME, num_classes=CLASSES)
  target = jax.eval_shape(lambda: model.init(jax.random.key(0), np.zeros((1, 56, 56, 1)),
                                             train=False)['params'])
  moved = transfer.transfer_params(npz.load_npz(path), target, has_cls=True, old_grid=None,
                                   new_grid=token_grid(model, 56))
  moved = npz._unflatten({**moved, **{f'head/{k}': v for k, v in  # pylint: disable=protected-access
                                      npz.load_npz(path)['head'].items()}})
  x = np.random.default_rng(1).uniform(-1, 1, (4, 56, 56, 1)).astype(np.float32)
  ours, theirs = _logits(bundle.spec, bundle.params, x), _logits(bundle.spec, moved, x)
  np.testing.assert_array_equal(ours, theirs)
  assert np.ptp(ours) > 0.1  # the logits vary: the comparison means something

  # predict on an image file at 56 px: the softmax of those logits.
  png = str(tmp_path / 'a.png')
  Image.fromarray(np.random.default_rng(2).integers(0, 255, (70, 60), np.uint8)).save(png)
  (result,) = inference.predict(bundle, [png], batch_size=2, top_k=CLASSES)
  image = image_files.load_one(png, bundle.eval_spec(), bundle.decode_channels)[None]
  probs = jax.nn.softmax(_logits(bundle.spec, moved, image), axis=-1)[0]
  got = {t['index']: t['probability'] for t in result['top']}
  np.testing.assert_allclose([got[i] for i in range(CLASSES)], probs, rtol=1e-5, atol=1e-6)


def test_sizes_the_patch_does_not_divide_are_one_line_errors(tmp_path):
  path = str(tmp_path / 'ze.npz')
  npz.save_npz(path, _params())
  with pytest.raises(UserError, match="--image_size=30 is not a multiple of the model's "
                                      '4-pixel patches: pass a multiple of 4'):
    bundle_lib.from_params_file(path, model_name=NAME, image_size=30)


@pytest.mark.slow
def test_a_workdir_and_its_analysis_at_another_size(tmp_path, data_dir):
  config = mnist5k.get_config(f'model_name={NAME}')
  config.data_dir = data_dir
  params = _params()
  params['head'] = {k: np.zeros((32, 10) if k == 'kernel' else (10,), np.float32)
                    for k in ('kernel', 'bias')}
  ckpt = train_ckpt.Checkpointer(str(tmp_path / 'run'), keep=1)
  ckpt.save(3, {'params': params, 'step': np.int32(3)}, config.to_dict())
  ckpt.close()
  bundle = bundle_lib.resolve(workdir=str(tmp_path / 'run'), image_size=40, data_dir=data_dir)
  resized = bundle.params['Transformer']['posembed_input']['pos_embedding']
  assert bundle.spec.image_size == 40 and resized.shape == (1, 101, 32)

  out = tmp_path / 'figures'
  summary = analysis.write_report(workdir=str(tmp_path / 'run'), out=str(out), num_images=2,
                                  data_dir=data_dir, image_size=40)
  assert summary['image_size'] == 40 and summary['grid'] == [10, 10]
  rollout = np.load(out / 'attention_rollout.npz')
  assert rollout['images'].shape == (2, 40, 40, 1) and rollout['maps'].shape == (2, 10, 10)
  sim = np.load(out / 'posemb_similarity.npz')['similarity']
  np.testing.assert_allclose(sim, analysis.posemb_similarity(bundle.params, (10, 10), True),
                             atol=1e-6)
