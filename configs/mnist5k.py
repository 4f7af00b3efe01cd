"""Any model on the embedded mnist5k (4,000 train / 1,000 test, 28 px): the base recipe.

The recipe, its arguments and its expected results: vit_jax/configs/mnist5k.py. Copy this file and
change values after `get_config` to make a recipe of your own.
"""

from vit_jax.configs import mnist5k


def get_config(arg: str | None = None):
  return mnist5k.get_config(arg)
