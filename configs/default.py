"""The quickstart: a small ViT trained from scratch on the embedded mnist5k (4,000 train / 1,000 test).

Run (what `make train` does):
  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_mnist5k

Arguments (`configs/default.py:model_name=ViT-Ze/4,steps=50`): model_name, steps, batch_size, lr.
Expected: see README.md ("make train"), measured on a 2-core CPU.
"""

from configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, model_name='ViT-Mu/4', steps=1600, batch_size=64, lr=3e-3)
  c = common.base_config()
  c.model_name = args['model_name']
  c.dataset = 'mnist5k'
  c.train_split = 'train'
  c.eval_split = 'test'
  c.image_size = 28
  c.pp.train_crop = 'pad_crop'
  c.pp.pad = 2
  c.pp.flip = False
  c.pp.eval_crop = 'resize'
  c.batch_size = args['batch_size']
  c.eval_batch_size = 200
  c.total_steps = args['steps']
  c.warmup_steps = 100
  c.optimizer = 'adam'
  c.lr = args['lr']
  c.weight_decay = 0.1
  c.decay_type = 'cosine'
  c.grad_clip_norm = 1.0
  c.log_every = 100
  c.eval_every = 400
  c.checkpoint_every = 400
  return c
