"""Compile a paper-scale recipe for the TPU slice it is planned for (vit_jax/configs/recipes.py TPU_PLANS).

  python -m vit_jax.main --config=configs/plans.py:recipe=pretrain,model=H/14 --workdir=/tmp/plan
  python -m vit_jax.main --config=configs/plans.py:recipe=headline,model=L/16 --workdir=/tmp/plan

prints what the TPU compiler says about the recipe's train and eval steps on that slice: per-core
parameters, optimizer state, temporaries, peak, the HBM fit, FLOPs and compile times. Nothing is
trained or read (the dataset need not exist; its class count comes from recipes.NUM_CLASSES).
`--config.batch_size` and `--config.eval_batch_size` plan another global batch (one that splits
over another slice of `--config.compile_for`); the report then gives the estimated step time of
the train and eval steps (docs/scaling.md, "Planning for TPUs").
Recipes: pretrain (configs/pretrain.py, ViT paper, Table 3, batch 4096 at 224 px) and headline
(configs/finetune.py headline=true: ImageNet at 512 px for L/16, 518 px for H/14, batch 512).
Needs the TPU compiler: `make tpu-compiler`. Expected: benchmarks/RESULTS.md, "Planning TPU runs";
how to read the report: docs/scaling.md.
"""

from vit_jax.configs import common
from vit_jax.configs import finetune
from vit_jax.configs import pretrain
from vit_jax.configs import recipes
from vit_jax.errors import UserError


def get_config(arg=None, settings=None):
  """`arg` is 'recipe=...,model=...' or a (recipe, model) key; `settings` ({key: value}) replaces
  the planned memory setting (benchmarks/tpu_plans.py --search)."""
  if isinstance(arg, tuple):
    recipe, model = arg
  else:
    args = common.parse_arg(arg, recipe='pretrain', model='H/14')
    recipe, model = args['recipe'], recipes.short(args['model'])
  if (recipe, model) not in recipes.TPU_PLANS:
    raise UserError(f'no TPU plan for recipe={recipe},model={model}: planned are '
                    f'{", ".join(f"{r}:{m}" for r, m in recipes.TPU_PLANS)}')
  plan = recipes.TPU_PLANS[(recipe, model)]
  if recipe == 'pretrain':
    c = pretrain.get_config(f'model={model},dataset={plan["dataset"]}')
  else:
    c = finetune.get_config(f'model={model},dataset={plan["dataset"]},headline=true')
  if settings is not None:  # back to the defaults, then `settings`
    common.apply(c, {k: common.get_value(common.base_config(), k) for k in plan['settings']})
    common.apply(c, settings)
  c.compile_for = plan['slice']
  c.num_classes = recipes.NUM_CLASSES[plan['dataset']]
  common.rgb_input(c)
  return c

