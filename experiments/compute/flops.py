"""Training FLOPs per image (forward + backward, XLA cost analysis) of the compute sweep's models.

python experiments/compute/flops.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sweep import MODELS  # pylint: disable=wrong-import-position

from vit_jax.models import cost, create_model  # pylint: disable=wrong-import-position


def main():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  print('| model | params | train MFLOPs / image | + per step | TFLOPs in 400 steps of 64 |')
  print('|---|---|---|---|---|')
  for name in MODELS:
    model = create_model(name, num_classes=10)
    x = jnp.zeros((1, 28, 28, 1))
    params = jax.eval_shape(lambda x, m=model: m.init(jax.random.key(0), x, train=False), x)['params']
    count = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    f = cost.flops(model, (28, 28, 1), backward=True)
    print(f'| {name} | {count:,} | {f.per_image / 1e6:.2f} | {f.per_step / 1e6:.2f} |'
          f' {400 * f.total(64) / 1e12:.2f} |')


if __name__ == '__main__':
  main()
