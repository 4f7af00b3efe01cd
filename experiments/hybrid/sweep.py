"""ViT against the hybrid (ResNet stem + ViT) at equal training compute, mnist5k (ViT paper, §4.2,
Fig. 5).

Train FLOPs per image (XLA cost analysis, `python -m vit_jax bench --model=M --image_size=28
--batch_size=64 --mode=train`): ViT-Mu/4 105.2 M, R+ViT-Mu/4 113.0 M; so the ViT gets
430 steps to the hybrid's 400 (equal within 0.1%), both with batch 64.

python -m vit_jax sweep --sweep=experiments/hybrid/sweep.py --workdir=runs/experiments/hybrid
"""


def get_sweep():
  return {
      'config': 'configs/mnist5k.py',
      'overrides': {'progress': False},
      'grid': {'model': ['ViT-Mu/4', 'R+ViT-Mu/4'], 'seed': [0, 1]},
      'variants': {'model': {
          'ViT-Mu/4': {'model_name': 'ViT-Mu/4', 'total_steps': 430},
          'R+ViT-Mu/4': {'model_name': 'R+ViT-Mu/4', 'total_steps': 400},
      }},
  }
