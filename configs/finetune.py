"""Fine-tuning: the paper's Table 4 (ImageNet, CIFAR-10/100, Pets, Flowers, VTAB-1k) and mnist5k.

The recipe, its arguments and its expected results: vit_jax/configs/finetune.py. Copy this file and
change values after `get_config` to make a recipe of your own.
"""

from vit_jax.configs import finetune


def get_config(arg: str | None = None):
  return finetune.get_config(arg)
