"""Stage 1 of the transfer experiment: ViT-Mu/4 pre-trained on mnist5k at 28 px, one per seed.

python -m vit_jax sweep --sweep=experiments/transfer/pretrain.py \
    --workdir=runs/experiments/transfer/pretrain
"""


def get_sweep():
  return {
      'config': 'configs/mnist5k.py:steps=400',  # the mnist5k base recipe, a quarter of the steps
      'overrides': {'progress': False},
      'grid': {'seed': [0, 1]},
  }
