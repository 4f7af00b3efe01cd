"""Dataset size (ViT paper, §4.2, Fig. 4 at small scale): a ViT, a hybrid and a BiT ResNet of
similar training FLOPs per image (ViT-Mu/4 103.8 M, R+ViT-Mu/4 107.6 M, BiT-R50x0.5 95.3 M; README,
"BiT baselines") trained on 500 / 1,000 / 2,500 / 4,500 mnist5k images, 400 steps of batch 64
each, evaluated on the same 500 held-out test images. The 4,500 are train (4,000) + the first
half of test; every subset is a prefix of tfds' key-hashed record order, so it is class-balanced
(train[:500] holds 37..62 images of each digit).

python -m vit_jax sweep --sweep=experiments/datasize/sweep.py --workdir=runs/experiments/datasize
"""

SIZES = {'500': 'train[:500]', '1000': 'train[:1000]', '2500': 'train[:2500]',
         '4500': 'train+test[:50%]'}


def get_sweep():
  return {
      'config': 'configs/mnist5k.py:steps=400',
      'overrides': {'progress': False, 'eval_split': 'test[50%:]', 'eval_every': 400},
      'grid': {'model': ['ViT-Mu/4', 'R+ViT-Mu/4', 'BiT-R50x0.5'],
               'examples': list(SIZES), 'seed': [0]},
      'variants': {
          'model': {m: {'model_name': m} for m in ('ViT-Mu/4', 'R+ViT-Mu/4', 'BiT-R50x0.5')},
          'examples': {n: {'train_split': split} for n, split in SIZES.items()},
      },
      'group': 'model',
      'x': 'examples',
  }
