"""Pre-training: the paper's Table 3 rows, the AugReg recipe, and a tiny CPU recipe on mnist5k.

Run (on a TPU pod; --config.data_dir holds the data: ImageNet-21k and ImageNet-1k as released,
read in place (docs/data.md), any other dataset prepared for tfds):
  python -m vit_jax.main --config=configs/pretrain.py:model=B/16,dataset=imagenet21k --workdir=DIR
  python -m vit_jax.main --config=configs/pretrain.py:model=L/16,dataset=jft300m,epochs=14 ...
  python -m vit_jax.main --config=configs/pretrain.py:model=B/16,dataset=imagenet21k,augreg=true
  python -m vit_jax.main --config=configs/pretrain.py:model=Mu/4,dataset=mnist5k --workdir=DIR
Then fine-tune with configs/finetune.py and --config.init=DIrecipes. Masked patch prediction (the
paper's self-supervised pre-training) is any of these with --config.loss=mpp.

Arguments:
  model     B/16, B/32, L/16, L/32, H/14, R50+B/16, R50+B/32, R50+L/16, R50+L/32 (paper rows);
            AugReg also Ti/16, S/16, S/32, R+Ti/16, R26+S/32; mnist5k any ViT-X/p (Mu/4, Ze/4)
  dataset   jft300m | imagenet21k | imagenet2012 | mnist5k. JFT-300M is not public: the tfds name
            is this config value, override it with --config.dataset=<your JFT builder>.
  epochs    one of the row's (JFT L/16: 7 or 14; i21k L: 90 or 30; AugReg i21k 300 or 30);
            default the first
  augreg    false: the ViT paper (Table 3); true: AugReg, cosine decay, lr 1e-3
  aug       AugReg augmentation level none|light1|light2|medium1|medium2|strong1|strong2;
            default the AugReg paper, Table 3 recommendation for the model (none without one)
  wd, dropout, sd   AugReg weight decay (paper convention), dropout, stochastic depth; default
            the recommendation (wd 0.1, no dropout/sd without one)
  steps, lr (mnist5k only)

Expected: the paper's numbers come after fine-tuning (configs/finetune.py; ViT paper, Tables 2 and
5). The mnist5k recipe is measured in docs/recipes.md.
"""

from vit_jax.configs import common
from vit_jax.configs import recipes
from vit_jax.errors import UserError

PAPER_MODELS = tuple(recipes.JFT_ROWS)


def _paper(c, model: str, dataset: str, epochs: float) -> None:
  """ViT paper, Table 3."""
  if model not in PAPER_MODELS:
    raise UserError(f'model={model} has no row in the paper\'s Table 3: use one of '
                    f'{", ".join(PAPER_MODELS)} (or augreg=true)')
  row = dict(recipes.PRETRAIN_DATASETS[dataset])
  if dataset == 'jft300m':
    allowed, row['lr'] = recipes.JFT_ROWS[model]
  elif dataset == 'imagenet21k':
    allowed = recipes.I21K_EPOCHS.get(recipes.base(model), (90,))
  else:
    allowed = row['epochs']
  c.total_epochs = float(recipes.choose(int(epochs), allowed, 'epochs'))
  c.lr = row['lr']
  c.decay_type = row['decay_type']
  c.weight_decay = row['weight_decay']
  c.weight_decay_mask = 'all'  # old flax.optim.Adam decayed every parameter
  c.model.dropout_rate = row['dropout_rate']
  c.grad_clip_norm = row['grad_clip_norm']
  c.model.representation_size = _width(model)  # ViT paper, §3.1: an MLP head with one hidden layer


def _augreg(c, model: str, dataset: str, epochs: float, args) -> None:
  """AugReg paper, §3.3-3.4 and Table 3."""
  if dataset not in recipes.AUGREG_EPOCHS:
    raise UserError(f'AugReg pre-trains on {" or ".join(recipes.AUGREG_EPOCHS)}, not {dataset}')
  aug, wd, dropout, sd = recipes.AUGREG_RECOMMENDED.get(model, ('none', 0.1, 0.0, 0.0))
  aug = args['aug'] or aug
  if aug not in recipes.AUG_LEVELS:
    raise UserError(f'aug={aug!r} is not an AugReg level: use one of '
                    f'{", ".join(recipes.AUG_LEVELS)}')
  c.total_epochs = float(recipes.choose(int(epochs), recipes.AUGREG_EPOCHS[dataset], 'epochs'))
  c.lr = recipes.AUGREG_LR
  c.decay_type = 'cosine'
  c.grad_clip_norm = 1.0
  c.weight_decay = wd if args['wd'] < 0 else args['wd']
  c.model.dropout_rate = dropout if args['dropout'] < 0 else args['dropout']
  c.model.stochastic_depth = sd if args['sd'] < 0 else args['sd']
  layers, magnitude, c.mixup = recipes.AUG_LEVELS[aug]
  if layers:
    c.pp.train += f'|randaug(num_layers={layers}, magnitude={magnitude})'
  # The AugReg paper: "drop the hidden layer in the head" for ImageNet-21k; big_vision keeps it for
  # i1k.
  c.model.representation_size = None if dataset == 'imagenet21k' else _width(model)


def _width(model: str) -> int:
  # Deferred: models imports JAX, and a config file loads without it.
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  return models.decode_variant(recipes.variant(model))['hidden_size']


def _mnist5k(c, args) -> None:
  """A CPU-sized pre-training on 28 px digits (not a paper recipe), for pre-train -> fine-tune."""
  c.image_size = 28
  c.pp.train, c.pp.eval = 'pad_crop(pad=2)', 'resize'
  c.batch_size, c.eval_batch_size = 64, 200
  c.total_steps = args['steps']
  c.warmup_steps = min(100, args['steps'] // 10)
  c.lr = args['lr']
  c.decay_type = 'cosine'
  c.weight_decay = 0.1
  c.model.representation_size = _width(args['model'])
  c.log_every, c.eval_every, c.checkpoint_every = 50, 400, 400


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model='B/16', dataset='imagenet21k', epochs=0.0, augreg=False,
                          aug='', wd=-1.0, dropout=-1.0, sd=-1.0, steps=800, lr=3e-3)
  model, dataset = recipes.short(args['model']), args['dataset']
  c = common.base_config()
  c.model_name = recipes.variant(model)
  c.dataset = dataset
  if dataset == 'mnist5k':
    _mnist5k(c, args)
    return c
  if dataset not in recipes.PRETRAIN_DATA:
    raise UserError(f'dataset={dataset!r} has no pre-training recipe: use one of '
                    f'{", ".join(list(recipes.PRETRAIN_DATA) + ["mnist5k"])}')
  data = recipes.PRETRAIN_DATA[dataset]
  c.train_split, c.eval_split, c.loss = data['train_split'], data['eval_split'], data['loss']
  c.model.head_bias_init = data['head_bias_init']
  c.batch_size = recipes.PRETRAIN_BATCH
  c.warmup_steps = recipes.PRETRAIN_WARMUP
  c.image_size = recipes.PRETRAIN_RESOLUTION
  c.optimizer, c.b1, c.b2 = 'adam', 0.9, 0.999
  c.pp.train = 'inception_crop|flip'
  c.pp.eval = 'central_crop(resize=256)'  # the shorter side to 256, then the central 224 px
  c.eval_every, c.checkpoint_every, c.log_every = 5000, 5000, 100
  if args['augreg']:
    _augreg(c, model, dataset, args['epochs'], args)
  else:
    for key in ('aug', 'wd', 'dropout', 'sd'):
      if args[key] not in ('', -1.0):
        raise UserError(f'{key}= is an AugReg setting: add augreg=true, or override the paper '
                        f'recipe with --config.<key>')
    _paper(c, model, dataset, args['epochs'])
  common.apply(c, recipes.plan_settings('pretrain', model))  # the TPU memory plan, if any
  return c
