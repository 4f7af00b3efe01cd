"""The numbers of the paper's recipes, in one place (ViT paper, Section 4.1, Appendix B.1 and
Tables 3-4).

configs/pretrain.py and configs/finetune.py read these tables; tests/test_recipes.py checks every
row against the paper. Model names here are short: 'B/16', 'R50+B/16'; `variant()` gives the
registered name ('ViT-B/16', 'R50+ViT-B/16').
"""

from vit_jax.errors import UserError

# ---------------------------------------------------------------------------------------------
# Pre-training, ViT paper, Table 3: batch 4096, Adam 0.9/0.999, 10k warmup steps, 224 px for every
# row; gradient clipping at global norm 1 for the ImageNet rows only.

PRETRAIN_BATCH = 4096
PRETRAIN_WARMUP = 10_000
PRETRAIN_RESOLUTION = 224

# model -> (epochs allowed, first = default; base lr). Hybrids train like their ViT counterparts.
JFT_ROWS = {
    'B/16': ((7,), 8e-4), 'B/32': ((7,), 8e-4), 'L/32': ((7,), 6e-4), 'L/16': ((7, 14), 4e-4),
    'H/14': ((14,), 3e-4), 'R50+B/16': ((7,), 8e-4), 'R50+B/32': ((7,), 8e-4),
    'R50+L/32': ((7,), 2e-4), 'R50+L/16': ((7, 14), 4e-4),
}
# dataset -> shared settings of its rows (JFT: per-model lr and epochs above).
PRETRAIN_DATASETS = {
    'jft300m': dict(decay_type='linear', weight_decay=0.1, dropout_rate=0.0, grad_clip_norm=0.0),
    'imagenet21k': dict(lr=1e-3, decay_type='linear', weight_decay=0.03, dropout_rate=0.1,
                        grad_clip_norm=1.0),
    'imagenet2012': dict(lr=3e-3, decay_type='cosine', weight_decay=0.3, dropout_rate=0.1,
                         grad_clip_norm=1.0, epochs=(300,)),
}
# ImageNet-21k epochs: B 90; L 30 or 90.
I21K_EPOCHS = {'B': (90,), 'L': (90, 30)}

# ---------------------------------------------------------------------------------------------
# AugReg (AugReg paper, §3.3-3.4): Adam 0.9/0.999, batch 4096, cosine, 10k warmup, clip 1.0, 224 px,
# lr 1e-3; ImageNet-21k 300 (or 30) epochs, ImageNet-1k 300 epochs.

AUG_LEVELS = {  # name -> (RandAugment layers, magnitude, mixup alpha)
    'none': (0, 0, 0.0), 'light1': (2, 0, 0.0), 'light2': (2, 10, 0.2),
    'medium1': (2, 15, 0.2), 'medium2': (2, 15, 0.5), 'strong1': (2, 20, 0.5),
    'strong2': (2, 20, 0.8),
}
AUGREG_LR = 1e-3
AUGREG_EPOCHS = {'imagenet21k': (300, 30), 'imagenet2012': (300,)}
# AugReg paper, Table 3 recommended checkpoints (i21k, 300 epochs): model -> (aug, wd, dropout,
# stoch. depth).
AUGREG_RECOMMENDED = {
    'L/16': ('strong1', 0.1, 0.0, 0.0), 'B/16': ('medium1', 0.1, 0.0, 0.0),
    'S/16': ('light1', 0.03, 0.0, 0.0), 'R50+L/32': ('medium1', 0.1, 0.1, 0.1),
    'R26+S/32': ('light1', 0.1, 0.0, 0.0), 'Ti/16': ('none', 0.03, 0.0, 0.0),
    'B/32': ('light1', 0.1, 0.0, 0.0), 'S/32': ('none', 0.1, 0.0, 0.0),
    'R+Ti/16': ('none', 0.03, 0.0, 0.0),
}

# Datasets as tfds names, splits (big_vision: i21k trains on full[51200:], tests on full[:25600]),
# and the loss and head-bias init big_vision's pre-training configs use (the paper does not state
# them).
PRETRAIN_DATA = {
    'jft300m': dict(train_split='train', eval_split='validation', loss='sigmoid_xent',
                    head_bias_init=-10.0),
    'imagenet21k': dict(train_split='full[51200:]', eval_split='full[:25600]',
                        loss='sigmoid_xent', head_bias_init=-10.0),
    'imagenet2012': dict(train_split='train', eval_split='validation', loss='sigmoid_xent',
                         head_bias_init=-6.9),
}

# ---------------------------------------------------------------------------------------------
# Fine-tuning, ViT paper, Table 4 / App. B.1.1: SGD momentum 0.9, batch 512, no weight decay, clip
# 1.0, cosine decay, 384 px. Dev splits (held out of train) for choosing the lr: 1% ImageNet, 2%
# CIFAR, 10% Pets and Flowers; final runs train on the whole train split.

FINETUNE_BATCH = 512
FINETUNE_RESOLUTION = 384
LR_GRID = (0.001, 0.003, 0.01, 0.03)
LR_GRID_IMAGENET = (0.003, 0.01, 0.03, 0.06)

# dataset -> steps, warmup, lr grid, default lr, dev %, eval split. Default lrs: the original
# vision_transformer code's 0.03 (ImageNet), the original vision_transformer code's B/16 CIFAR-10
# value 0.01 (CIFAR), big_vision transfer.py's 0.003 (Pets, Flowers); the paper picks each from its
# grid on the dev split.
FINETUNE_ROWS = {
    'imagenet2012': dict(steps=20_000, warmup=500, grid=LR_GRID_IMAGENET, lr=0.03, dev=1,
                         eval_split='validation'),
    'cifar10': dict(steps=10_000, warmup=500, grid=LR_GRID, lr=0.01, dev=2, eval_split='test'),
    'cifar100': dict(steps=10_000, warmup=500, grid=LR_GRID, lr=0.01, dev=2, eval_split='test'),
    'oxford_iiit_pet': dict(steps=500, warmup=100, grid=LR_GRID, lr=0.003, dev=10,
                            eval_split='test'),
    'oxford_flowers102': dict(steps=500, warmup=100, grid=LR_GRID, lr=0.003, dev=10,
                              eval_split='test'),
}
# ImageNet headline (ViT paper, Table 2): higher resolution and Polyak averaging.
HEADLINE_RESOLUTION = {'L/16': 512, 'H/14': 518}
HEADLINE_POLYAK = 0.9999
# The original vision_transformer code's fine-tuning dropout per model (0.0 for every other model).
FINETUNE_DROPOUT = {'L/16': 0.1, 'H/14': 0.1, 'R50+B/16': 0.1}

# ---------------------------------------------------------------------------------------------
# Paper-scale plans (configs/plans.py; docs/scaling.md, "Planning for TPUs with the TPU compiler"):
# the Cloud TPU slice each planned recipe runs on, and its settings: the ones under which its train
# and eval steps fit a TPU v3 core's 16 GiB there (benchmarks/tpu_plans.py --search), and of those
# the fastest by the TPU compiler's estimated step time (benchmarks/tpu_estimates.py
# --only=settings: bf16 compute for the ViT pre-training rows; fp32 parameters and Adam moments
# stay). The settings are part of the recipe: configs/pretrain.py and finetune.py apply them.
# Slices: the paper's Table 2 budgets in TPUv3-core-days (H/14 2.5k, L/16 0.68k on JFT) over a
# v3-512 (4.9 days) and a v3-256 (2.7 days); B/16 (no budget in Table 2) and the fine-tunes (batch
# 512: 2 images per core at 518 px) on a v3-256. The hybrids R50+B/16 and R50+L/16 (no budget in
# Table 2 either) on the slice of the ViT their pre-training compute is close to (ViT paper, Table 6,
# exaFLOPs: R50+B/16 274 against B/16 224, R50+L/16 859 against L/16 783, 7 epochs).

BF16 = {'model.dtype': 'bfloat16'}
NUM_CLASSES = {'jft300m': 18_291, 'imagenet21k': 21_843, 'imagenet2012': 1_000}
TPU_PLANS = {
    ('pretrain', 'B/16'): dict(slice='v3-256', dataset='jft300m', settings=BF16),
    ('pretrain', 'L/16'): dict(slice='v3-256', dataset='jft300m', settings=BF16),
    ('pretrain', 'H/14'): dict(slice='v3-512', dataset='jft300m', settings=BF16),
    ('pretrain', 'R50+B/16'): dict(slice='v3-256', dataset='jft300m', settings={}),
    ('pretrain', 'R50+L/16'): dict(slice='v3-256', dataset='jft300m', settings={}),
    ('headline', 'L/16'): dict(slice='v3-256', dataset='imagenet2012', settings={}),
    ('headline', 'H/14'): dict(slice='v3-256', dataset='imagenet2012', settings={}),
}


def plan_settings(recipe: str, model: str) -> dict:
  """The planned memory setting ({config key: value}) of `recipe` for `model`, or {}."""
  return dict(TPU_PLANS.get((recipe, short(model)), {}).get('settings', {}))


# VTAB-1k: 19 tasks, each trained on 1,000 images (800 train + 200 val) for 2,500 steps at lr
# 0.01 (ViT paper, Appendix B.1.1), on the benchmark's own splits and labels
# (vit_jax/data/sources/vtab.py: dataset 'vtab/<task>').
VTAB_STEPS = 2_500
VTAB_LR = 0.01
VTAB_WARMUP = 500


def variant(model: str) -> str:
  """'B/16' -> 'ViT-B/16', 'R50+B/16' -> 'R50+ViT-B/16'; registered names pass through."""
  if 'ViT-' in model:
    return model
  stem, plus, vit = model.rpartition('+')
  return f'{stem}{plus}ViT-{vit}'


def short(model: str) -> str:
  """'ViT-B/16' -> 'B/16', 'R50+ViT-B/16' -> 'R50+B/16'."""
  return model.replace('ViT-', '')


def base(model: str) -> str:
  """'R50+L/32' -> 'L'."""
  return short(model).rpartition('+')[2].split('/')[0]


def choose(value, allowed, what: str):
  """`value` if it is one of `allowed` (or falsy: the first of them), else a UserError."""
  if not value:
    return allowed[0]
  if value not in allowed:
    raise UserError(f'{what}={value!r} is not one of the paper\'s values '
                    f'{", ".join(map(str, allowed))}')
  return value


def lr_grid(dataset: str):
  """The fine-tuning learning rates the paper sweeps for `dataset` (ViT paper, Table 4)."""
  if dataset.startswith('vtab/'):
    return (VTAB_LR,)
  if dataset not in FINETUNE_ROWS:
    raise UserError(f'no fine-tuning lr grid for {dataset!r}: use one of '
                    f'{", ".join(FINETUNE_ROWS)} or vtab/<task>')
  return FINETUNE_ROWS[dataset]['grid']
