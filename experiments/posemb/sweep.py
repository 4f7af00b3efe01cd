"""Position embeddings: none vs learned 1-D vs fixed 2-D sin-cos (ViT paper, App. D.4, Table 8),
mnist5k.

python -m vit_jax sweep --sweep=experiments/posemb/sweep.py --workdir=runs/experiments/posemb
"""


def get_sweep():
  return {
      'config': 'configs/mnist5k.py:steps=800',  # the mnist5k base recipe (ViT-Mu/4), half the steps
      'overrides': {'progress': False},
      'grid': {'model.posemb': ['none', 'learned', 'sincos2d'], 'seed': [0, 1]},
  }
