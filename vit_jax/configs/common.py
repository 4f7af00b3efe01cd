"""Every config key, its default and its meaning: the one schema all experiment configs start from.

Experiment configs call `base_config()` and change values; they never add keys. Nothing derived is
stored here (step counts from epochs, class counts from the dataset, per-device batch): the trainer
resolves those at run time, so a command-line override never leaves a stale value behind.

Config files take `key=value,key=value` arguments (`configs/default.py:model_name=ViT-Ze/4`); see
`parse_arg`. Full reference: configs/README.md.
"""

from ml_collections import config_dict

from vit_jax.errors import UserError

placeholder = config_dict.placeholder


def base_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()

  # Model: a variant name decoded by vit_jax.models (ViT-B/16, R50+ViT-B/16, ViT-Mu/4, any ViT-X/p).
  c.model_name = 'ViT-B/16'
  c.model = config_dict.ConfigDict()
  c.model.classifier = 'token'            # token | gap | unpooled | map
  c.model.representation_size = placeholder(int)  # pre-logits Dense+tanh width; None = no pre-logits
  c.model.posemb = 'learned'              # learned | sincos2d | none
  c.model.dropout_rate = 0.0              # after every dense layer but qkv, and after adding posemb
  c.model.attention_dropout_rate = 0.0    # on the attention weights
  c.model.stochastic_depth = 0.0          # max drop-path rate, linear in depth
  c.model.dtype = 'float32'               # compute dtype: float32 | bfloat16
  c.model.param_dtype = 'float32'         # parameter dtype (keep float32 for training)
  c.model.head_bias_init = 0.0            # initial head bias (-10 for sigmoid i21k pre-training)
  c.model.gelu_approximate = True         # tanh GELU as the original; False = exact erf
  c.model.remat = 'none'                  # none | full | dots | gelu: rematerialise each encoder
                                          # block (dots keeps the Dense outputs, recomputes the
                                          # rest; gelu recomputes only the MLP's GELU output)
  c.model.scan = False                    # encoder blocks as one scanned layer: compiled once, not
                                          # per block; params stacked [L, ...] in training state
                                          # only (files keep encoderblock_{i}); same math
  c.model.attention = 'auto'              # auto | einsum | dot_product | cudnn | flash: attention
                                          # kernel; auto = flash on TPU, cudnn on GPU (einsum
                                          # where cuDNN cannot run), einsum on CPU
                                          # (einsum wherever attention_dropout_rate > 0)
  c.model.fp8 = False                     # encoder dense layers as fp8 matmuls, delayed scaling
                                          # (NVIDIA GPUs of compute capability >= 8.9 only);
                                          # evaluation and exported weights run them in dtype
  # Register tokens and the attention-pool head (docs/models.md).
  c.model.num_registers = 0               # register tokens after cls: attended to, never pooled;
                                          # 0 = the original model (same params)
  # FlexiViT (docs/models.md): params stored at one patch kernel and position-embedding grid,
  # resized at call time to the model's patch size (the variant's, e.g. ViT-B/16) and token grid.
  c.model.flexi_patch = 0                 # side of the stored patch kernel (PI-resized); 0 = off
  c.model.flexi_grid = 0                  # side of the stored learned posemb grid; 0 = off
  c.model.flexi_resize = 'bilinear'       # posemb resize: bilinear | bicubic | lanczos3 |
                                          # lanczos5 | nearest (jax.image.resize)

  # Data: any tensorflow-datasets name; mnist5k and digits are embedded, read from their arrays.
  c.dataset = 'mnist5k'                   # tfds name, or 'folder:/path' (one sub-folder per class)
  c.data_dir = placeholder(str)           # tfds data_dir (local or gs://); None = tfds default
  c.train_split = 'train'
  c.eval_split = 'test'
  c.num_classes = placeholder(int)        # None = read from the dataset's metadata
  c.image_size = 224                      # side of the square model input, pixels
  c.pp = config_dict.ConfigDict()
  c.pp.train = 'inception_crop|flip'     # train ops by name, 'op|op(arg, k=v)|...' (docs/data.md)
  c.pp.eval = 'central_crop'              # eval ops (deterministic); channels(n) in both lists
                                          # converts gray <-> RGB
  c.shuffle_buffer = 50_000
  c.cache = True                          # cache undecoded tfds records in memory (small datasets)
  c.prefetch = 2                          # batches prefetched by tf.data

  # Schedule: give total_steps or total_epochs (exactly one); warmup in steps.
  c.batch_size = 4096                     # global batch over all processes and devices
  c.eval_batch_size = 512                 # global eval batch (last batch padded and masked)
  c.total_steps = placeholder(int)
  c.total_epochs = placeholder(float)
  c.warmup_steps = 10_000
  c.accum_steps = 1                       # gradient accumulation: micro-batches per step
  # FlexiViT training (model.flexi_patch set): each step's patch size drawn from this list by the
  # seed and the step (each size its own compiled step); () = the model's one patch size.
  c.flexi_patch_sizes = ()                # e.g. 8,10,12,16 (divisors of image_size)
  c.flexi_patch_probs = ()                # weight of each size (normalised); () = uniform

  # Optimiser.
  c.optimizer = 'adam'                    # adam | sgd
  c.lr = 1e-3                             # peak learning rate
  c.b1 = 0.9                              # Adam beta1
  c.b2 = 0.999                            # Adam beta2
  c.momentum = 0.9                        # SGD momentum
  c.mu_dtype = 'float32'                  # Adam first moment / SGD momentum dtype (bfloat16 ok)
  c.weight_decay = 0.0                    # paper convention: per-step decay = lr_t * wd * param
  c.weight_decay_mask = 'kernels'         # kernels (only .../kernel params) | all
  c.decay_type = 'linear'                 # linear | cosine (after the linear warmup)
  c.lr_end = 0.0                          # learning rate at the end of the decay
  c.grad_clip_norm = 1.0                  # global-norm clipping; 0 = off
  c.loss = 'softmax_xent'                 # softmax_xent | sigmoid_xent | mpp (masked patch pred.)
  c.label_smoothing = 0.0

  # Recipes: augmentation and regularisation, transfer, self-supervision, evaluators.
  c.mixup = 0.0                           # mixup Beta(a, a) alpha, one lambda per step; 0 = off
  c.polyak_decay = 0.0                    # evaluate a moving average of the params; 0 = off
  c.init = placeholder(str)               # start from: a workdir, a checkpoint step dir or an .npz
  c.init_posemb_resize = 'bilinear'       # bilinear | bicubic: posemb resize to a new grid
  c.mpp = config_dict.ConfigDict()        # masked patch prediction (loss=mpp)
  c.mpp.ratio = 0.5                       # fraction of patch embeddings corrupted per image
  c.mpp.mask_prob = 0.8                   # of those: replaced by the learnable [mask] embedding
  c.mpp.random_prob = 0.1                 # of those: another patch's embedding (the rest: kept)

  # Evaluators: one entry per evaluator by name (docs/evaluation.md), logged under that name:
  # `type` (a registered evaluator type), `every` (steps between its runs, and at the end;
  # None = eval_every; 0 = not during training, the evaluate command still runs it), and the
  # type's options. A config file adds entries (c.evals.NAME = dict(type=...)).
  c.evals = config_dict.ConfigDict()
  c.evals.eval = config_dict.ConfigDict(dict(      # the eval split's top-1 and loss
      type='top1', every=placeholder(int),
      split=placeholder(str),                     # None = eval_split
      patch_sizes=placeholder(tuple)))            # FlexiViT: also scored at these patch sizes
                                                  # (None = flexi_patch_sizes; () = its own)
  c.evals.fewshot = config_dict.ConfigDict(dict(   # few-shot linear evaluation, frozen features
      type='fewshot', every=0,
      dataset=placeholder(str),                   # None = the run's dataset
      train_split='train',                        # the first n images per class: the n-shot set
      eval_split='test',
      shots=(1, 5, 10, 25),                       # images per class
      l2_reg=1.0,                                 # ridge penalty of the closed-form least squares
      patch_sizes=placeholder(tuple)))            # FlexiViT: as evals.eval.patch_sizes
  c.evals.knn = config_dict.ConfigDict(dict(       # k-NN on frozen features (DINO's vote)
      type='knn', every=0, dataset=placeholder(str), train_split='train', eval_split='test',
      k=20,                                       # neighbours
      temperature=0.07,                           # vote weight exp(cosine similarity / T)
      weighting='exp'))                           # exp | uniform
  c.evals.linear_probe = config_dict.ConfigDict(dict(  # logistic regression on frozen features
      type='linear_probe', every=0, dataset=placeholder(str), train_split='train',
      eval_split='test',
      l2_grid=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2),     # L2 strengths tried on the held-out part
      holdout=0.2,                                # fraction of train_split held out to choose
      steps=500))                                 # L-BFGS iterations
  c.evals.real = config_dict.ConfigDict(dict(      # ImageNet ReaL top-1 (ImageNet-1k models)
      type='real', every=0, dataset='imagenet2012_real', split='validation'))

  # Devices: mesh data x fsdp x model must equal the device count; one axis may be -1 (the rest).
  c.parallelism = 'jit'                   # jit (sharded, any mesh) | pmap (per-device + pmean)
  c.mesh = config_dict.ConfigDict()
  c.mesh.data = -1                        # data parallel: batch split, parameters replicated
  c.mesh.fsdp = 1                         # FSDP: batch split, parameters and optimizer split
  c.mesh.model = 1                        # tensor parallel: attention heads and MLP units split
  c.data_sharding = 'process'             # process: each process reads its share of the split;
                                          # global: every process reads the global order and keeps
                                          # its rows (same batches on any process count)
  c.compile_only = False                  # compile the train and eval steps, print their
                                          # per-device memory, exit (nothing trained or read)
  c.compile_for = ''                      # compile-only for a device that is not here, with
                                          # its compiler: a TPU slice (v3-8, v3-256, v4-32,
                                          # v5litepod-16, v3:4x4) or a GPU (h100, h200)

  # Loop.
  c.seed = 0
  c.log_every = 50                        # steps between train-metric logs
  c.eval_every = 1000                     # steps between evaluations (and at the end)
  c.checkpoint_every = 1000               # steps between checkpoints (and at the end)
  c.keep_checkpoints = 3                  # keep the newest K checkpoints
  c.progress = True                       # progress line on stderr
  c.max_nonfinite_steps = 0               # 0: stop at the first NaN/Inf loss or gradient;
                                          # K: skip up to K such steps (counted in the log)
  return c


# How a config argument or a `--config.KEY=...` override says "no value" (vit_jax/cli.py reads
# the same spelling for overrides): Python's None only, since `none` is a value of several keys
# (model.remat, model.posemb, the `aug` argument of configs/pretrain.py).
UNSET_SPELLINGS = ('None',)


def rgb_input(c) -> None:
  """Ends both op lists with `channels(3)`: the model takes RGB images whatever the dataset
  stores (a config compiled or benchmarked without its dataset)."""
  c.pp.train += '|channels(3)'
  c.pp.eval += '|channels(3)'


def parse_arg(arg: str | None, **defaults):
  """Parses `key=value,key=value` into a dict typed like `defaults`; unknown keys are errors."""
  out = dict(defaults)
  if not arg:
    return out
  for item in arg.split(','):
    if '=' not in item:
      raise UserError(f'config argument {item!r} is not key=value; valid keys: {sorted(defaults)}')
    key, value = item.split('=', 1)
    if key not in defaults:
      raise UserError(f'unknown config argument {key!r}; valid keys: {sorted(defaults)}')
    kind = type(defaults[key])
    if value in UNSET_SPELLINGS and defaults[key] is None:  # key=None: an optional value unset
      out[key] = None
    elif kind is bool:
      if value.lower() not in ('1', 'true', 'yes', '0', 'false', 'no'):
        raise UserError(f'config argument {key}={value!r} is not a bool: use true or false')
      out[key] = value.lower() in ('1', 'true', 'yes')
    elif defaults[key] is None:
      out[key] = value
    else:
      try:
        out[key] = kind(value)
      except ValueError:
        raise UserError(f'config argument {key}={value!r} is not a valid {kind.__name__}') from None
  return out


def get_value(c, key: str):
  """c['a.b'] for a dotted key."""
  for part in key.split('.'):
    c = c[part]
  return c


def set_value(c, key: str, value) -> None:
  """c['a.b'] = value for a dotted key (the key must exist: configs are locked)."""
  *parents, leaf = key.split('.')
  for part in parents:
    c = c[part]
  c[leaf] = value


def apply(c, settings: dict) -> None:
  """Sets every dotted key of `settings` ({'model.remat': 'full', ...}) in `c`."""
  for key, value in settings.items():
    set_value(c, key, value)
