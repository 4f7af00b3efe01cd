"""Stage 2: fine-tune on scikit-learn's digits at 32 px (an 8x8 patch grid instead of 7x7: head
reset, position embeddings resized) from the mnist5k model of the same seed, against training on
digits from scratch; each start at its own best lr (chosen on 10% of the digits train split).

python -m vit_jax sweep --sweep=experiments/transfer/finetune.py \
    --workdir=runs/experiments/transfer/finetune
"""


def get_sweep():
  return {
      'config': 'configs/finetune.py:model=Mu/4,dataset=digits,image_size=32,steps=300',
      'overrides': {'progress': False},
      'grid': {'start': ['scratch', 'pretrained'], 'lr': [0.003, 0.01, 0.03], 'seed': [0, 1]},
      'variants': {'start': {
          'scratch': {},
          'pretrained': {'init': 'runs/experiments/transfer/pretrain/grid/seed_{seed}'},
      }},
      'group': 'start',
      'x': 'lr',
      'select': {'dev': {'train_split': 'train[:90%]', 'eval_split': 'train[90%:]'}, 'final': {}},
  }
