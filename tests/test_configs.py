"""The config schema: documented, typed, locked, and parsed from `key=value` arguments."""

import os

import pytest

from configs import default
from vit_jax.configs import common, mnist5k
from vit_jax.errors import UserError
from helpers import ROOT



def _flat_keys(config, prefix=''):
  out = []
  for key, value in config.items():
    out += _flat_keys(value, f'{prefix}{key}.') if hasattr(value, 'items') else [prefix + key]
  return out


def test_every_key_is_documented_in_configs_readme():
  with open(os.path.join(ROOT, 'configs', 'README.md')) as f:
    readme = f.read()
  missing = [k for k in _flat_keys(common.base_config()) if f'| `{k}` |' not in readme]
  assert not missing, f'undocumented config keys: {missing}'


@pytest.mark.parametrize('module', [default, mnist5k], ids=['default', 'mnist5k'])
def test_mnist5k_configs_add_no_keys_and_parse_arguments(module):
  assert sorted(_flat_keys(module.get_config())) == sorted(_flat_keys(common.base_config()))
  c = module.get_config('model_name=ViT-Ze/4,steps=7,batch_size=16,lr=0.5')
  assert (c.model_name, c.total_steps, c.batch_size, c.lr) == ('ViT-Ze/4', 7, 16, 0.5)
  assert isinstance(c.total_steps, int) and isinstance(c.lr, float)


def test_default_is_the_mnist5k_recipe_plus_its_vit_settings():
  """make train's recipe differs from the base (experiments, benchmarks) only where it says."""
  ours, base = default.get_config(), mnist5k.get_config()
  changed = {k for k in _flat_keys(ours) if common.get_value(ours, k) != common.get_value(base, k)}
  assert changed == {'model_name', 'total_steps', 'model.posemb', 'label_smoothing',
                     'weight_decay', 'polyak_decay', 'eval_every', 'checkpoint_every'}
  assert (ours.model_name, base.model_name) == ('ViT-Mu/7', 'ViT-Mu/4')
  assert (ours.weight_decay, base.weight_decay) == (0.3, 0.1)
  assert base.model.posemb == 'learned' and base.polyak_decay == 0.0


@pytest.mark.parametrize('arg, needle', [
    ('stepz=5', "unknown config argument 'stepz'"),
    ('steps', 'is not key=value'),
    ('steps=many', "steps='many' is not a valid int"),
])
def test_bad_config_arguments(arg, needle):
  with pytest.raises(UserError, match=needle):
    default.get_config(arg)


def test_bool_arguments():
  assert common.parse_arg('flag=false', flag=True)['flag'] is False
  assert common.parse_arg('flag=True', flag=False)['flag'] is True
  with pytest.raises(UserError, match='not a bool'):
    common.parse_arg('flag=maybe', flag=True)


def test_setup_installs_only_the_vit_jax_package(monkeypatch):
  """The schema and recipes live in vit_jax.configs; a top-level `configs` package would collide
  with any other installed package of that name."""
  import runpy  # pylint: disable=g-import-not-at-top
  import setuptools  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: seen.update(kwargs))
  monkeypatch.chdir(ROOT)
  runpy.run_path(os.path.join(ROOT, 'setup.py'))
  packages = seen['packages']
  assert 'vit_jax.configs' in packages and 'vit_jax' in packages
  assert all(p == 'vit_jax' or p.startswith('vit_jax.') for p in packages), packages
