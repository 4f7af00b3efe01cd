"""Pre-training: the paper's Table 3 rows, the AugReg recipe, and a tiny CPU recipe on mnist5k.

The recipe, its arguments and its expected results: vit_jax/configs/pretrain.py. Copy this file and
change values after `get_config` to make a recipe of your own.
"""

from vit_jax.configs import pretrain


def get_config(arg: str | None = None):
  return pretrain.get_config(arg)
