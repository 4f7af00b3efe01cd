"""Accuracy against training compute (ViT paper, §4.2, Fig. 5 at small scale): three sizes of each
family (ViT, hybrid, BiT ResNet), 400 steps of batch 64 on mnist5k's 4,000 train images, evaluated
on the 1,000 test images. Training FLOPs per image come from XLA's cost analysis
(experiments/compute/flops.py prints them); the README's table multiplies them by 400 x 64.

python -m vit_jax sweep --sweep=experiments/compute/sweep.py --workdir=runs/experiments/compute
"""

MODELS = ('ViT-Mu/7', 'ViT-Ze/4', 'ViT-Mu/4', 'R+ViT-Ze/4', 'R+ViT-Mu/4',
          'BiT-R14x0.5', 'BiT-R26x0.5', 'BiT-R50x0.5')


def family(model: str) -> str:
  return model.split('-')[0].split('+')[0]


def get_sweep():
  return {
      'config': 'configs/mnist5k.py:steps=400',
      'overrides': {'progress': False, 'eval_every': 400},
      'grid': {'model_name': list(MODELS), 'seed': [0]},
  }
