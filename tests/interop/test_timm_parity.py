"""Same weights, same logits: this project's models and timm 1.0.31 (torch 2.13 CPU), fp32.

Error measure: max |ours - timm| over all logits, divided by max |logit| of the model the weights
came from. ViT-B/16 and ViT-Ti/16 must agree to 1e-5 in both directions: ours -> .safetensors ->
timm (`timm.create_model(arch, act_layer='gelu_tanh')`), and timm -> .safetensors -> ours.
Hybrids use timm's stock hybrids, whose stem differs slightly in its epsilons (GroupNorm 1e-5 vs
1e-6; weight standardisation sqrt(var + 1e-8) vs std + 1e-5); the deep R50 stem also accumulates
more float32 rounding, so it gets 5e-5. timm's own npz loader (`_load_weights`) must read our
`save_npz` files, and the convert CLI's output must load into timm.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.torch
import timm
import torch
from timm.models.vision_transformer import _load_weights

from parity_figures import FIGURES
from vit_jax.formats import npz, timm_layout
from vit_jax.models.spec import ModelSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = {  # our name: (timm architecture, tolerance)
    'ViT-Ti/16': ('vit_tiny_patch16_224', 1e-5),
    'ViT-B/16': ('vit_base_patch16_224', 1e-5),
    'R+ViT-Ti/16': ('vit_tiny_r_s16_p8_224', 1e-5),
    'R50+ViT-B/16': ('vit_base_r50_s16_224', 5e-5),
}
NUM_CLASSES = 1000
torch.set_num_threads(2)


def _images(seed=0):
  return np.random.RandomState(seed).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32)


def _ours(spec, params, images):
  model = spec.build()
  return np.asarray(jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(params,
                                                                                     images))


def _timm_logits(model, images):
  with torch.no_grad():
    return model(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()).numpy()


def _timm_model(name):
  arch = CASES[name][0]
  spec = ModelSpec(name, NUM_CLASSES, {}, 224, 3)
  kwargs = timm_layout.timm_config(spec)['kwargs']
  assert timm_layout.timm_config(spec)['architecture'] == arch
  return timm.create_model(arch, pretrained=False, **kwargs).eval(), spec


def _our_params(spec, seed):
  """Our init with every leaf moved by N(0, 0.02): no zero head, no unit scales left."""
  model = spec.build()
  params = model.init(jax.random.key(seed), np.zeros((1, 224, 224, 3), np.float32),
                      train=False)['params']
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda p: np.asarray(p) + rng.normal(0, .02, p.shape).astype(np.float32),
                      params)


def _relative(got, want):
  assert np.abs(want).max() > 0.1, 'near-zero logits would make the comparison meaningless'
  return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize('name', sorted(CASES))
def test_ours_to_timm_via_safetensors(name, tmp_path):
  timm_model, spec = _timm_model(name)
  params = _our_params(spec, seed=1)
  path = str(tmp_path / 'ours.safetensors')
  timm_layout.save_safetensors(path, params, spec=spec)
  timm_model.load_state_dict(safetensors.torch.load_file(path), strict=True)  # every key, once
  images = _images()
  want = _ours(spec, params, images)
  error = _relative(_timm_logits(timm_model, images), want)
  FIGURES.append((name, 'ours -> .safetensors -> timm', error))
  assert error <= CASES[name][1]


@pytest.mark.parametrize('name', sorted(CASES))
def test_timm_to_ours_via_safetensors(name, tmp_path):
  timm_model, spec = _timm_model(name)
  torch.manual_seed(2)
  with torch.no_grad():
    for p in timm_model.parameters():  # timm's init has zero biases and unit norms: perturb all
      p.add_(0.02 * torch.randn_like(p))
  path = str(tmp_path / 'timm.safetensors')
  safetensors.torch.save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()},
                              path)
  params, stored = timm_layout.load_safetensors(path, num_heads=spec.variant()['num_heads'])
  assert stored is None
  params = npz.fit_to_model(params, spec.build(), (224, 224, 3), name=name)  # exact key set
  images = _images(1)
  want = _timm_logits(timm_model, images)
  error = _relative(_ours(spec, params, images), want)
  FIGURES.append((name, 'timm -> .safetensors -> ours', error))
  assert error <= CASES[name][1]


@pytest.mark.parametrize('name', ['ViT-Ti/16', 'R50+ViT-B/16'])
def test_timm_npz_loader_reads_save_npz(name, tmp_path):
  timm_model, spec = _timm_model(name)
  params = _our_params(spec, seed=3)
  path = str(tmp_path / 'released.npz')
  npz.save_npz(path, params)
  _load_weights(timm_model, path)
  images = _images(2)
  error = _relative(_timm_logits(timm_model, images), _ours(spec, params, images))
  FIGURES.append((name, 'ours -> save_npz -> timm _load_weights', error))
  assert error <= CASES[name][1]


def test_convert_cli_output_loads_into_timm(tmp_path):
  timm_model, spec = _timm_model('ViT-Ti/16')
  params = _our_params(spec, seed=4)
  npz.save_npz(str(tmp_path / 'ti.npz'), params)
  out = tmp_path / 'ti.safetensors'
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'convert',
                         f'--checkpoint={tmp_path}/ti.npz', f'--out={out}'],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  timm_model.load_state_dict(safetensors.torch.load_file(str(out)), strict=True)
  images = _images(3)
  error = _relative(_timm_logits(timm_model, images), _ours(spec, params, images))
  FIGURES.append(('ViT-Ti/16', 'ours .npz -> convert CLI -> timm', error))
  assert error <= 1e-5


def _both_ways(spec, label, seed, tmp_path):
  """ours -> .safetensors -> timm and timm -> .safetensors -> ours for `spec`'s timm model (built
  from `timm_config`); returns the timm model."""
  cfg = timm_layout.timm_config(spec)
  timm_model = timm.create_model(cfg['architecture'], pretrained=False, **cfg['kwargs']).eval()
  params = _our_params(spec, seed=seed)
  path = str(tmp_path / 'ours.safetensors')
  timm_layout.save_safetensors(path, params, spec=spec)
  timm_model.load_state_dict(safetensors.torch.load_file(path), strict=True)
  images = _images(seed)
  error = _relative(_timm_logits(timm_model, images), _ours(spec, params, images))
  FIGURES.append((label, 'ours -> .safetensors -> timm', error))
  assert error <= 1e-5
  torch.manual_seed(seed)
  with torch.no_grad():
    for p in timm_model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  path = str(tmp_path / 'timm.safetensors')
  safetensors.torch.save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()},
                              path)
  params, _ = timm_layout.load_safetensors(path, num_heads=spec.variant()['num_heads'])
  params = npz.fit_to_model(params, spec.build(), (224, 224, 3), name=label)  # exact key set
  images = _images(seed + 1)
  error = _relative(_ours(spec, params, images), _timm_logits(timm_model, images))
  FIGURES.append((label, 'timm -> .safetensors -> ours', error))
  assert error <= 1e-5
  return timm_model


# Register tokens: timm's layout of its reg-token models (reg_tokens=R, no_embed_class=True), with
# a cls token and with global average pooling (as timm's vit_*_reg4_gap_* models).
REGISTER_CASES = {'token': dict(), 'gap': dict(classifier='gap')}


@pytest.mark.parametrize('pool', sorted(REGISTER_CASES))
def test_register_models_convert_both_ways(pool, tmp_path):
  spec = ModelSpec('ViT-Ti/16', NUM_CLASSES, dict(num_registers=4, **REGISTER_CASES[pool]), 224, 3)
  timm_model = _both_ways(spec, f'ViT-Ti/16 reg4 {pool}', 5, tmp_path)
  assert timm_model.num_prefix_tokens == (pool == 'token') + 4


def test_map_head_models_convert_both_ways(tmp_path):
  """classifier='map' and timm's global_pool='map' (AttentionPoolLatent), both directions."""
  spec = ModelSpec('ViT-Ti/16', NUM_CLASSES, dict(classifier='map'), 224, 3)
  timm_model = _both_ways(spec, 'ViT-Ti/16 map', 7, tmp_path)
  assert timm_model.attn_pool is not None and timm_model.num_prefix_tokens == 0
