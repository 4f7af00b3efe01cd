"""Any model on the embedded mnist5k (4,000 train / 1,000 test, 28 px): the base recipe.

ViT-Mu/4 for 1,600 steps of batch 64, Adam lr 3e-3, 100 warmup steps (steps - 1 for a run of
100 steps or fewer), cosine decay, random 2-pixel
shifts, learned position embeddings, nothing else (about 96% test top-1). The experiments
(experiments/*/sweep.py) and the benchmarks start from it, so their tables stay reproducible. It holds only settings every model family takes (a BiT too):
configs/default.py adds the ViT-specific ones of the quickstart.

  python -m vit_jax.main --config=configs/mnist5k.py:model_name=BiT-R50x0.5,steps=400 --workdir=DIR

Arguments (`configs/mnist5k.py:model_name=ViT-Ze/4,steps=50`): model_name, steps, batch_size, lr.
"""

from vit_jax.configs import common


def recipe(model_name: str, steps: int, batch_size: int, lr: float):
  """The mnist5k training config of `model_name`."""
  c = common.base_config()
  c.model_name = model_name
  c.dataset = 'mnist5k'
  c.train_split = 'train'
  c.eval_split = 'test'
  c.image_size = 28
  c.pp.train = 'pad_crop(pad=2)'
  c.pp.eval = 'resize'
  c.batch_size = batch_size
  c.eval_batch_size = 200
  c.total_steps = steps
  c.warmup_steps = min(100, max(steps - 1, 0))  # below total_steps, as the validation asks
  c.optimizer = 'adam'
  c.lr = lr
  c.weight_decay = 0.1
  c.decay_type = 'cosine'
  c.grad_clip_norm = 1.0
  c.log_every = 100
  c.eval_every = 400
  c.checkpoint_every = 400
  return c


def get_config(arg: str | None = None):
  return recipe(**common.parse_arg(arg, model_name='ViT-Mu/4', steps=1600, batch_size=64, lr=3e-3))
