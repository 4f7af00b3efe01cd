"""The recipe configs against the paper: every Table 3 and Table 4 row, AugReg, schedules."""

import math
import os
import re

import numpy as np
import pytest

from vit_jax.configs import common, finetune, pretrain, recipes
from vit_jax.data import specs
from vit_jax.data.sources import vtab
from vit_jax.errors import UserError
from vit_jax.train import optim, program
from helpers import ROOT

IMAGENET_TRAIN = 1_281_167  # images in ImageNet-2012's train split (tfds imagenet2012)


def _flat_keys(config, prefix=''):
  out = []
  for key, value in config.items():
    out += _flat_keys(value, f'{prefix}{key}.') if hasattr(value, 'items') else [prefix + key]
  return sorted(out)


def _schedule(c, total_steps):
  return optim.make_schedule(lr=c.lr, total_steps=total_steps, warmup_steps=c.warmup_steps,
                             decay_type=c.decay_type, lr_end=c.lr_end)


# ---------------------------------------------------------------- P Table 3

# (model, dataset, epochs arg) -> epochs, lr, decay, weight decay, dropout, clip.
TABLE_3 = [
    ('B/16', 'jft300m', 0, 7, 8e-4, 'linear', 0.1, 0.0, 0.0),
    ('B/32', 'jft300m', 0, 7, 8e-4, 'linear', 0.1, 0.0, 0.0),
    ('L/32', 'jft300m', 0, 7, 6e-4, 'linear', 0.1, 0.0, 0.0),
    ('L/16', 'jft300m', 0, 7, 4e-4, 'linear', 0.1, 0.0, 0.0),
    ('L/16', 'jft300m', 14, 14, 4e-4, 'linear', 0.1, 0.0, 0.0),
    ('H/14', 'jft300m', 0, 14, 3e-4, 'linear', 0.1, 0.0, 0.0),
    ('R50+B/16', 'jft300m', 0, 7, 8e-4, 'linear', 0.1, 0.0, 0.0),
    ('R50+B/32', 'jft300m', 0, 7, 8e-4, 'linear', 0.1, 0.0, 0.0),
    ('R50+L/32', 'jft300m', 0, 7, 2e-4, 'linear', 0.1, 0.0, 0.0),
    ('R50+L/16', 'jft300m', 0, 7, 4e-4, 'linear', 0.1, 0.0, 0.0),
    ('R50+L/16', 'jft300m', 14, 14, 4e-4, 'linear', 0.1, 0.0, 0.0),
    ('B/16', 'imagenet21k', 0, 90, 1e-3, 'linear', 0.03, 0.1, 1.0),
    ('B/32', 'imagenet21k', 0, 90, 1e-3, 'linear', 0.03, 0.1, 1.0),
    ('L/16', 'imagenet21k', 0, 90, 1e-3, 'linear', 0.03, 0.1, 1.0),
    ('L/16', 'imagenet21k', 30, 30, 1e-3, 'linear', 0.03, 0.1, 1.0),
    ('L/32', 'imagenet21k', 30, 30, 1e-3, 'linear', 0.03, 0.1, 1.0),
    ('R50+B/16', 'imagenet21k', 0, 90, 1e-3, 'linear', 0.03, 0.1, 1.0),  # as its ViT
    ('B/16', 'imagenet2012', 0, 300, 3e-3, 'cosine', 0.3, 0.1, 1.0),
    ('L/16', 'imagenet2012', 0, 300, 3e-3, 'cosine', 0.3, 0.1, 1.0),
    ('H/14', 'imagenet2012', 0, 300, 3e-3, 'cosine', 0.3, 0.1, 1.0),
]


@pytest.mark.parametrize('model, dataset, arg, epochs, lr, decay, wd, dropout, clip', TABLE_3)
def test_table_3_rows(model, dataset, arg, epochs, lr, decay, wd, dropout, clip):
  c = pretrain.get_config(f'model={model},dataset={dataset},epochs={arg}')
  assert _flat_keys(c) == _flat_keys(common.base_config())  # recipes add no keys
  assert c.model_name == recipes.variant(model) and c.dataset == dataset
  assert (c.batch_size, c.optimizer, c.b1, c.b2) == (4096, 'adam', 0.9, 0.999)
  assert (c.warmup_steps, c.image_size) == (10_000, 224)
  assert (c.total_epochs, c.total_steps) == (epochs, None)
  assert (c.lr, c.decay_type, c.weight_decay) == (lr, decay, wd)
  assert c.weight_decay_mask == 'all'  # old flax.optim.Adam decayed every parameter
  assert (c.model.dropout_rate, c.model.attention_dropout_rate, c.grad_clip_norm) == (
      dropout, 0.0, clip)
  assert c.model.classifier == 'token'
  assert c.model.representation_size == {'B': 768, 'L': 1024, 'H': 1280}[recipes.base(model)]
  assert 'randaug' not in c.pp.train and (c.mixup, c.model.stochastic_depth) == (0.0, 0.0)


def test_imagenet_1k_schedule_at_chosen_steps():
  c = pretrain.get_config('model=B/16,dataset=imagenet2012')
  steps = program.resolve_steps(c, IMAGENET_TRAIN)
  assert steps == math.ceil(300 * IMAGENET_TRAIN / 4096) == 93_836
  s = _schedule(c, steps)
  expected = {0: 0.0, 5_000: 1.5e-3, 10_000: 3e-3,
              10_000 + (steps - 10_000) // 2: 1.5e-3, steps: 0.0}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(s(step)), lr, atol=2e-7, err_msg=f'step {step}')
  quarter = 10_000 + (steps - 10_000) / 4
  np.testing.assert_allclose(float(s(quarter)), 3e-3 * 0.5 * (1 + np.cos(np.pi / 4)), rtol=1e-4)


def test_jft_linear_schedule_at_chosen_steps():
  c = pretrain.get_config('model=L/16,dataset=jft300m,epochs=14')
  steps = program.resolve_steps(c, 300_000_000)  # the size is read from the dataset at run time
  assert steps == math.ceil(14 * 300_000_000 / 4096)
  s = _schedule(c, steps)
  for step, lr in {0: 0.0, 2_500: 1e-4, 10_000: 4e-4, 10_000 + (steps - 10_000) // 2: 2e-4,
                   steps: 0.0}.items():
    np.testing.assert_allclose(float(s(step)), lr, atol=1e-8, err_msg=f'step {step}')


def _randaug(c):
  """(num_layers, magnitude) of the randaug op in a config's train ops, or None."""
  calls = [call for call in specs.train_spec(c.pp.train, c.image_size).ops.calls
           if call.name == 'randaug']
  return (calls[0].keywords['num_layers'], calls[0].keywords['magnitude']) if calls else None


def test_pretrain_data_settings():
  c = pretrain.get_config('model=B/16,dataset=imagenet21k')
  assert (c.train_split, c.eval_split) == ('full[51200:]', 'full[:25600]')
  assert (c.loss, c.model.head_bias_init) == ('sigmoid_xent', -10.0)
  assert (c.pp.train, c.pp.eval) == ('inception_crop|flip', 'central_crop(resize=256)')
  c = pretrain.get_config('model=B/16,dataset=imagenet2012')
  assert (c.train_split, c.eval_split, c.model.head_bias_init) == ('train', 'validation', -6.9)


# ---------------------------------------------------------------- AugReg


@pytest.mark.parametrize('level, layers, magnitude, alpha', [
    ('none', 0, 0, 0.0), ('light1', 2, 0, 0.0), ('light2', 2, 10, 0.2), ('medium1', 2, 15, 0.2),
    ('medium2', 2, 15, 0.5), ('strong1', 2, 20, 0.5), ('strong2', 2, 20, 0.8)])
def test_augreg_levels(level, layers, magnitude, alpha):
  c = pretrain.get_config(f'model=B/16,dataset=imagenet21k,augreg=true,aug={level}')
  assert (_randaug(c), c.mixup) == ((layers, magnitude) if layers else None, alpha)


@pytest.mark.parametrize('model, aug, wd, dropout, sd', [
    ('L/16', 'strong1', 0.1, 0.0, 0.0), ('B/16', 'medium1', 0.1, 0.0, 0.0),
    ('S/16', 'light1', 0.03, 0.0, 0.0), ('R50+L/32', 'medium1', 0.1, 0.1, 0.1),
    ('R26+S/32', 'light1', 0.1, 0.0, 0.0), ('Ti/16', 'none', 0.03, 0.0, 0.0),
    ('B/32', 'light1', 0.1, 0.0, 0.0), ('S/32', 'none', 0.1, 0.0, 0.0),
    ('R+Ti/16', 'none', 0.03, 0.0, 0.0)])
def test_augreg_recommended_settings(model, aug, wd, dropout, sd):
  c = pretrain.get_config(f'model={model},dataset=imagenet21k,augreg=true')
  layers, magnitude, alpha = recipes.AUG_LEVELS[aug]
  assert (_randaug(c), c.mixup) == ((layers, magnitude) if layers else None, alpha)
  assert (c.weight_decay, c.model.dropout_rate, c.model.stochastic_depth) == (wd, dropout, sd)
  assert (c.lr, c.decay_type, c.grad_clip_norm, c.batch_size, c.warmup_steps) == (
      1e-3, 'cosine', 1.0, 4096, 10_000)
  assert (c.total_epochs, c.image_size, c.model.representation_size) == (300, 224, None)


def test_augreg_overrides_and_imagenet_1k():
  c = pretrain.get_config('model=B/16,dataset=imagenet21k,augreg=true,epochs=30,aug=strong2,'
                          'wd=0.03,dropout=0.1,sd=0.1')
  assert (c.total_epochs, c.mixup, c.weight_decay, c.model.dropout_rate,
          c.model.stochastic_depth) == (30, 0.8, 0.03, 0.1, 0.1)
  c = pretrain.get_config('model=S/16,dataset=imagenet2012,augreg=true')
  assert (c.total_epochs, c.model.representation_size) == (300, 384)


# ---------------------------------------------------------------- P Table 4

# dataset -> steps, warmup, default lr, lr grid, eval split, dev splits.
TABLE_4 = [
    ('imagenet2012', 20_000, 500, 0.03, (0.003, 0.01, 0.03, 0.06), 'validation',
     ('train[:99%]', 'train[99%:]')),
    ('cifar10', 10_000, 500, 0.01, (0.001, 0.003, 0.01, 0.03), 'test',
     ('train[:98%]', 'train[98%:]')),
    ('cifar100', 10_000, 500, 0.01, (0.001, 0.003, 0.01, 0.03), 'test',
     ('train[:98%]', 'train[98%:]')),
    ('oxford_iiit_pet', 500, 100, 0.003, (0.001, 0.003, 0.01, 0.03), 'test',
     ('train[:90%]', 'train[90%:]')),
    ('oxford_flowers102', 500, 100, 0.003, (0.001, 0.003, 0.01, 0.03), 'test',
     ('train[:90%]', 'train[90%:]')),
]


@pytest.mark.parametrize('dataset, steps, warmup, lr, grid, eval_split, dev', TABLE_4)
def test_table_4_rows(dataset, steps, warmup, lr, grid, eval_split, dev):
  c = finetune.get_config(f'model=B/16,dataset={dataset}')
  assert _flat_keys(c) == _flat_keys(common.base_config())
  assert (c.optimizer, c.momentum, c.batch_size, c.weight_decay) == ('sgd', 0.9, 512, 0.0)
  assert (c.grad_clip_norm, c.decay_type, c.image_size) == (1.0, 'cosine', 384)
  assert (c.total_steps, c.warmup_steps, c.lr) == (steps, warmup, lr)
  assert recipes.lr_grid(dataset) == grid and lr in grid
  assert (c.train_split, c.eval_split) == ('train', eval_split)
  assert (c.model.representation_size, c.model.dropout_rate, c.polyak_decay) == (None, 0.0, 0.0)
  assert c.evals.real.every == (None if dataset == 'imagenet2012' else 0)  # ReaL: ImageNet only
  d = finetune.get_config(f'model=B/16,dataset={dataset},dev=true,lr={grid[0]}')
  assert (d.train_split, d.eval_split, d.lr, d.evals.real.every) == dev + (grid[0], 0)
  # The learning-rate schedule at chosen steps.
  s = _schedule(c, steps)
  half = warmup + (steps - warmup) / 2
  for step, value in {0: 0.0, warmup // 2: lr / 2, warmup: lr, half: lr / 2, steps: 0.0}.items():
    np.testing.assert_allclose(float(s(step)), value, atol=1e-9, err_msg=f'step {step}')


def test_imagenet_headline_and_model_dropout():
  c = finetune.get_config('model=L/16,dataset=imagenet2012,headline=true')
  assert (c.image_size, c.polyak_decay, c.model.dropout_rate) == (512, 0.9999, 0.1)
  c = finetune.get_config('model=H/14,dataset=imagenet2012,headline=true')
  assert (c.image_size, c.polyak_decay, c.model.dropout_rate) == (518, 0.9999, 0.1)
  assert finetune.get_config('model=R50+B/16,dataset=cifar10').model.dropout_rate == 0.1
  with pytest.raises(UserError, match='headline=true'):
    finetune.get_config('model=B/16,dataset=imagenet2012,headline=true')
  with pytest.raises(UserError, match='headline=true'):
    finetune.get_config('model=L/16,dataset=cifar10,headline=true')


def test_vtab_1k():
  """All 19 tasks, on the benchmark's splits (vit_jax/data/sources/vtab.py, tests/test_vtab.py)."""
  assert len(vtab.TASKS) == 19
  for task in vtab.TASKS:
    c = finetune.get_config(f'model=B/16,dataset=vtab/{task}')
    assert (c.total_steps, c.lr, c.batch_size, c.optimizer) == (2_500, 0.01, 512, 'sgd')
    assert (c.dataset, c.train_split, c.eval_split) == (f'vtab/{task}', 'train800val200', 'test')
    d = finetune.get_config(f'model=B/16,dataset=vtab/{task},dev=true')
    assert (d.train_split, d.eval_split) == ('train800', 'val200')
  assert recipes.lr_grid('vtab/dtd') == (0.01,)
  # An unknown task is refused by its data source, when the dataset is looked up before any
  # heavy import (tests/test_vtab.py), not by the recipe.
  from vit_jax.data import info as info_lib  # pylint: disable=g-import-not-at-top
  bad = finetune.get_config('model=B/16,dataset=vtab/mnist')
  with pytest.raises(UserError, match='unknown VTAB task'):
    info_lib.get_info(bad.dataset, None)


# ---------------------------------------------------------------- mistakes and the CPU recipes


@pytest.mark.parametrize('config, arg, needle', [
    (pretrain, 'model=S/16,dataset=jft300m', "has no row in the paper's Table 3"),
    (pretrain, 'model=B/16,dataset=jft300m,epochs=14', "epochs=14 is not one of the paper's"),
    (pretrain, 'model=B/16,dataset=imagenet21k,aug=light1', 'is an AugReg setting'),
    (pretrain, 'model=B/16,dataset=imagenet21k,augreg=true,aug=heavy', 'not an AugReg level'),
    (pretrain, 'model=B/16,dataset=jft300m,augreg=true', 'AugReg pre-trains on'),
    (pretrain, 'model=B/16,dataset=coco', 'has no pre-training recipe'),
    (finetune, 'model=B/16,dataset=coco', 'has no fine-tuning recipe'),
    (finetune, 'model=B/16,dataset=cifar10,steps=x', "steps='x' is not a valid int"),
])
def test_bad_recipe_arguments(config, arg, needle):
  with pytest.raises(UserError, match=needle):
    config.get_config(arg)


def test_mnist5k_recipes():
  p = pretrain.get_config('model=Mu/4,dataset=mnist5k,steps=200')
  assert (p.model_name, p.image_size, p.total_steps, p.model.representation_size) == (
      'ViT-Mu/4', 28, 200, 64)
  f = finetune.get_config('model=ViT-Mu/4,dataset=mnist5k')
  assert (f.model_name, f.image_size, f.optimizer, f.model.representation_size) == (
      'ViT-Mu/4', 36, 'sgd', None)
  assert _flat_keys(p) == _flat_keys(f) == _flat_keys(common.base_config())


# ---------------------------------------------------------------- TPU plans (configs/plans.py)


def test_every_tpu_plan_is_its_recipe_compiled_for_its_slice():
  """configs/plans.py: the recipe as configs/pretrain.py or finetune.py states it, plus the slice
  and the dataset's class count (nothing is read); the hybrids are planned too."""
  from vit_jax.configs import plans  # pylint: disable=g-import-not-at-top
  assert {('pretrain', 'R50+B/16'), ('pretrain', 'R50+L/16')} <= set(recipes.TPU_PLANS)
  for (recipe, model), plan in recipes.TPU_PLANS.items():
    c = plans.get_config(f'recipe={recipe},model={recipes.variant(model)}')
    if recipe == 'pretrain':
      stated = pretrain.get_config(f'model={model},dataset={plan["dataset"]}')
      assert (c.batch_size, c.image_size) == (4096, 224)
    else:
      stated = finetune.get_config(f'model={model},dataset={plan["dataset"]},headline=true')
      assert (c.batch_size, c.image_size) == (512, {'L/16': 512, 'H/14': 518}[model])
    assert (c.compile_for, c.num_classes) == (plan['slice'], recipes.NUM_CLASSES[plan['dataset']])
    assert (c.pp.train, c.pp.eval) == (stated.pp.train + '|channels(3)',
                                       stated.pp.eval + '|channels(3)')
    for key in ('model_name', 'lr', 'weight_decay', 'total_steps', 'total_epochs', 'warmup_steps'):
      assert c[key] == stated[key], (recipe, model, key)
  with pytest.raises(UserError, match=r'no TPU plan for recipe=pretrain,model=S/16: planned are '
                                      r'pretrain:B/16, .*pretrain:R50\+L/16'):
    plans.get_config('recipe=pretrain,model=S/16')


# ---------------------------------------------------------------- preprocessing ops

# Each shipped recipe's (train ops, eval ops, image_size), as the preprocessing keys that the op
# strings replaced (pp.train_crop, pp.eval_crop, pp.resize, pp.pad, pp.flip, pp.channels,
# randaug.*) composed them: the op strings give the same pipelines, random ops at the same seed
# slots (crop 0, flip 1, randaug 2).
_INCEPTION = 'inception_crop|flip'
_PINNED_OPS = {
    'configs/default.py': ('pad_crop(pad=2)', 'resize', 28),
    'configs/mnist5k.py': ('pad_crop(pad=2)', 'resize', 28),
    'configs/finetune.py:dataset=imagenet2012': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=cifar10': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=cifar100': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=oxford_iiit_pet': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=oxford_flowers102': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=vtab/dtd': (_INCEPTION, 'resize', 384),
    'configs/finetune.py:dataset=mnist5k': ('pad_crop(pad=2)', 'resize', 36),
    'configs/finetune.py:dataset=digits': ('pad_crop(pad=1)', 'resize', 36),
    'configs/finetune.py:model=L/16,dataset=imagenet2012,headline=true': (
        _INCEPTION, 'resize', 512),
    'configs/pretrain.py:dataset=jft300m': (_INCEPTION, 'central_crop(resize=256)', 224),
    'configs/pretrain.py:dataset=imagenet21k': (_INCEPTION, 'central_crop(resize=256)', 224),
    'configs/pretrain.py:dataset=imagenet2012': (_INCEPTION, 'central_crop(resize=256)', 224),
    'configs/pretrain.py:dataset=mnist5k': ('pad_crop(pad=2)', 'resize', 28),
    'configs/pretrain.py:augreg=true,aug=none': (_INCEPTION, 'central_crop(resize=256)', 224),
    **{f'configs/pretrain.py:augreg=true,aug={level}': (
        f'{_INCEPTION}|randaug(num_layers=2, magnitude={magnitude})',
        'central_crop(resize=256)', 224)
       for level, magnitude in (('light1', 0), ('light2', 10), ('medium1', 15), ('medium2', 15),
                                ('strong1', 20), ('strong2', 20))},
    **{f'configs/plans.py:recipe=pretrain,model={m}': (
        f'{_INCEPTION}|channels(3)', 'central_crop(resize=256)|channels(3)', 224)
       for m in ('B/16', 'L/16', 'H/14', 'R50+B/16', 'R50+L/16')},
    'configs/plans.py:recipe=headline,model=L/16': (
        f'{_INCEPTION}|channels(3)', 'resize|channels(3)', 512),
    'configs/plans.py:recipe=headline,model=H/14': (
        f'{_INCEPTION}|channels(3)', 'resize|channels(3)', 518),
}


def _user_config(spec: str):
  """The config of a top-level config file with its argument ('configs/x.py:arg')."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('user_config', os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


@pytest.mark.parametrize('recipe', sorted(_PINNED_OPS))
def test_every_recipe_gives_the_pipeline_it_gave_before_the_op_strings(recipe):
  c = _user_config(recipe)
  parsed = specs.of_config(c)
  assert (str(parsed.train.ops), str(parsed.eval.ops), c.image_size) == _PINNED_OPS[recipe]
  # The seed slot of op i is i (vit_jax/data/ops.py): the recipes' random ops sit where they did.
  slots = {call.name: i for i, call in enumerate(parsed.train.ops.calls)}
  assert all(slots[name] == slot for name, slot in (('inception_crop', 0), ('pad_crop', 0),
                                                     ('flip', 1), ('randaug', 2))
             if name in slots), slots


_OLD_PP_KEYS = ('train_crop', 'eval_crop', 'resize', 'pad', 'flip', 'channels')


def test_the_older_preprocessing_keys_are_gone_from_schema_recipes_and_docs():
  c = common.base_config()
  assert set(c.pp.keys()) == {'train', 'eval'} and 'randaug' not in c
  spelled = re.compile(r'pp\.(' + '|'.join(_OLD_PP_KEYS) + r')\b|randaug\.(num_layers|magnitude)')
  files = ['README.md'] + [os.path.join(d, f) for d in ('docs', 'configs', 'vit_jax/configs')
                           for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(('.md', '.py'))]
  files += [os.path.join(d, f) for d, _, names in os.walk(os.path.join(ROOT, 'experiments'))
            for f in names if f.endswith(('.md', '.py'))]
  found = [(f, m.group(0)) for f in files
           for m in spelled.finditer(open(os.path.join(ROOT, f)).read())]
  assert not found, found
