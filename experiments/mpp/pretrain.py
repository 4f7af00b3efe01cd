"""Stage 1 of the self-supervision experiment: masked patch prediction on mnist5k (all 4,000 train
images, labels unused), ViT-Mu/4 at 28 px, 400 steps, one per seed.

python -m vit_jax sweep --sweep=experiments/mpp/pretrain.py --workdir=runs/experiments/mpp/pretrain
"""


def get_sweep():
  return {
      'config': 'configs/pretrain.py:model=Mu/4,dataset=mnist5k,steps=400',
      'overrides': {'loss': 'mpp', 'progress': False},
      'grid': {'seed': [0, 1]},
  }
