"""Position embeddings: none vs learned 1-D vs fixed 2-D sin-cos (P App. D.4, Table 8), mnist5k.

python -m vit_jax.sweep --sweep=experiments/posemb/sweep.py --workdir=runs/experiments/posemb
"""


def get_sweep():
  return {
      'config': 'configs/default.py',  # the make-train recipe: ViT-Mu/4, 1,600 steps
      'overrides': {'progress': False},
      'grid': {'model.posemb': ['none', 'learned', 'sincos2d'], 'seed': [0, 1, 2]},
  }
