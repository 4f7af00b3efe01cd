"""Stage 2: fine-tune on 400 labelled mnist5k images (train[:10%]) at 36 px from the masked-patch
model of the same seed, against the same fine-tune from scratch.

python -m vit_jax sweep --sweep=experiments/mpp/finetune.py --workdir=runs/experiments/mpp/finetune
"""


def get_sweep():
  return {
      'config': 'configs/finetune.py:model=Mu/4,dataset=mnist5k',
      'overrides': {'train_split': 'train[:10%]', 'progress': False},
      'grid': {'start': ['scratch', 'mpp'], 'seed': [0, 1]},
      'variants': {'start': {
          'scratch': {},
          'mpp': {'init': 'runs/experiments/mpp/pretrain/grid/seed_{seed}'},
      }},
  }
