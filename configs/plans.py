"""Compile a paper-scale recipe for the TPU slice it is planned for (vit_jax/configs/recipes.py TPU_PLANS).

The recipe, its arguments and its expected results: vit_jax/configs/plans.py. Copy this file and
change values after `get_config` to make a recipe of your own.
"""

from vit_jax.configs import plans


def get_config(arg: str | None = None):
  return plans.get_config(arg)
