"""Class token vs global average pooling, each at its own best learning rate (ViT paper, App. D.3,
Fig. 9).

The lr is chosen on a held-out 10% of the train split, as the paper chose its lrs; the chosen
setting is then trained on the whole train split and evaluated on the test split.

python -m vit_jax sweep --sweep=experiments/classifier/sweep.py --workdir=runs/experiments/classifier
"""


def get_sweep():
  return {
      'config': 'configs/mnist5k.py:steps=300',
      'overrides': {'progress': False},
      'grid': {'model.classifier': ['token', 'gap'], 'lr': [0.001, 0.003, 0.01],
               'seed': [0, 1]},
      'group': 'model.classifier',
      'x': 'lr',
      'select': {'dev': {'train_split': 'train[:90%]', 'eval_split': 'train[90%:]'}, 'final': {}},
  }
