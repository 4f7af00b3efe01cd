"""Fine-tuning: the paper's Table 4 (ImageNet, CIFAR-10/100, Pets, Flowers, VTAB-1k) and mnist5k.

Run (datasets prepared as tfds datasets in --config.data_dir; INIT = a pre-training workdir, a
checkpoint step directory, an official .npz, or official weights by name, e.g.
ViT-B/16@imagenet21k: python -m vit_jax weights lists them):
  python -m vit_jax.main --config=configs/finetune.py:model=B/16,dataset=cifar10 \
      --config.init=INIT --workdir=DIR
  python -m vit_jax.main --config=configs/finetune.py:model=B/16,dataset=cifar10,dev=true,lr=0.003
  python -m vit_jax.main --config=configs/finetune.py:model=L/16,dataset=imagenet2012,headline=true
  python -m vit_jax.main --config=configs/finetune.py:model=B/16,dataset=vtab/dtd --config.init=...
  python -m vit_jax.main --config=configs/finetune.py:model=Mu/4,dataset=mnist5k --config.init=...
  python -m vit_jax.main --config=configs/finetune.py:model=Mu/4,dataset=digits,image_size=32 ...

The head is replaced by a zero-initialised one for the new classes, pre_logits are dropped and the
position embeddings are resized to the new resolution (vit_jax/train/transfer.py).

Arguments:
  model     any variant, short (B/16, R50+B/16) or registered (ViT-B/16) name
  dataset   imagenet2012 | cifar10 | cifar100 | oxford_iiit_pet | oxford_flowers102 |
            vtab/<task> (the 19 VTAB-1k tasks, vit_jax/data/sources/vtab.py) | mnist5k | digits
  lr        default: see vit_jax/configs/recipes.py; the paper picks it from recipes.lr_grid(dataset)
            on the dev split
  dev       true: train on the train split minus the held-out dev part and evaluate on that part
            (ImageNet 1%, CIFAR 2%, Pets/Flowers 10%, VTAB the 200 val images); false: train on
            the whole train split (VTAB: all 1,000) and evaluate on the test split
  headline  ImageNet only: 512 px (L/16) or 518 px (H/14) with Polyak averaging 0.9999 (ViT paper,
  Table 2) steps, image_size (mnist5k and digits only)

Expected: ViT paper, Table 2 / Table 5; the mnist5k recipe is measured in docs/recipes.md.
"""

from vit_jax.configs import common
from vit_jax.configs import recipes
from vit_jax.errors import UserError


def _common(c) -> None:
  """ViT paper, App. B.1.1: SGD momentum 0.9, batch 512, no weight decay, clip 1.0, cosine, 384
  px."""
  # bf16 momentum, as the original vision_transformer code.
  c.optimizer, c.momentum, c.mu_dtype = 'sgd', 0.9, 'bfloat16'
  c.batch_size, c.eval_batch_size = recipes.FINETUNE_BATCH, recipes.FINETUNE_BATCH
  c.weight_decay = 0.0
  c.grad_clip_norm = 1.0
  c.decay_type = 'cosine'
  c.image_size = recipes.FINETUNE_RESOLUTION
  c.loss = 'softmax_xent'
  c.pp.train = 'inception_crop|flip'
  # The original vision_transformer code: the whole image resized to image_size, no central crop.
  c.pp.eval = 'resize'
  c.model.representation_size = None  # the pre-training pre_logits layer is dropped


def _table4(c, dataset: str, args) -> None:
  row = recipes.FINETUNE_ROWS[dataset]
  c.total_steps, c.warmup_steps = row['steps'], row['warmup']
  c.lr = args['lr'] or row['lr']
  if args['dev']:
    keep = 100 - row['dev']
    c.train_split, c.eval_split = f'train[:{keep}%]', f'train[{keep}%:]'
  else:
    c.train_split, c.eval_split = 'train', row['eval_split']
  if dataset == 'imagenet2012' and not args['dev']:
    c.evals.real.every = None  # ReaL top-1 on the same images, at every evaluation
  c.eval_every = c.checkpoint_every = min(1000, row['steps'])
  c.log_every = 50


def _vtab(c, task: str, args) -> None:
  """A VTAB-1k task: train on train800val200 (dev: train800, evaluated on val200), test on the
  task's test split."""
  c.dataset = 'vtab/' + task  # the task name is checked by the data source when it is opened
  c.total_steps, c.warmup_steps = recipes.VTAB_STEPS, recipes.VTAB_WARMUP
  c.lr = args['lr'] or recipes.VTAB_LR
  if args['dev']:
    c.train_split, c.eval_split = 'train800', 'val200'
  else:
    c.train_split, c.eval_split = 'train800val200', 'test'
  c.eval_every = c.checkpoint_every = 500
  c.log_every = 50


def _small(c, args) -> None:
  """A CPU-sized fine-tune on an embedded dataset (mnist5k 28 px, digits 8 px), resized to
  image_size (36 by default, not the 28 px of the mnist5k pre-training)."""
  c.batch_size, c.eval_batch_size = 64, 200
  c.image_size = args['image_size']
  pad = 2 if c.dataset == 'mnist5k' else 1  # random shifts of at most 2 px (digits: 1 of 8 px)
  c.pp.train, c.pp.eval = f'pad_crop(pad={pad})', 'resize'
  c.total_steps = args['steps']
  c.warmup_steps = max(1, args['steps'] // 10)
  c.lr = args['lr'] or 0.03
  c.train_split, c.eval_split = ('train[:90%]', 'train[90%:]') if args['dev'] else ('train', 'test')
  c.log_every, c.eval_every, c.checkpoint_every = 50, 500, 500


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model='B/16', dataset='cifar10', lr=0.0, dev=False,
                          headline=False, steps=300, image_size=36)
  model, dataset = recipes.short(args['model']), args['dataset']
  c = common.base_config()
  c.model_name = recipes.variant(model)
  c.dataset = dataset
  _common(c)
  c.model.dropout_rate = recipes.FINETUNE_DROPOUT.get(model, 0.0)
  if dataset in ('mnist5k', 'digits'):
    _small(c, args)
  elif dataset.startswith('vtab/'):
    _vtab(c, dataset[len('vtab/'):], args)
  elif dataset in recipes.FINETUNE_ROWS:
    _table4(c, dataset, args)
  else:
    raise UserError(f'dataset={dataset!r} has no fine-tuning recipe: use one of '
                    f'{", ".join(recipes.FINETUNE_ROWS)}, vtab/<task>, mnist5k or digits')
  if args['headline']:
    if dataset != 'imagenet2012' or model not in recipes.HEADLINE_RESOLUTION:
      raise UserError(f'headline=true is the paper\'s ImageNet setting for '
                      f'{" and ".join(recipes.HEADLINE_RESOLUTION)}: use dataset=imagenet2012 '
                      f'with one of those models')
    c.image_size = recipes.HEADLINE_RESOLUTION[model]
    c.polyak_decay = recipes.HEADLINE_POLYAK
    common.apply(c, recipes.plan_settings('headline', model))  # the TPU memory plan, if any
  return c
