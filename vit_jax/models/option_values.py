"""The valid values of the model options, and the one check of them (`check_values`).

The tables the modules dispatch on live here (classifiers, position embeddings, remat policies;
the attention kernels in vit_jax/models/attention.py), so the check reads the very tables the
code uses. `check_values` runs where a model is made (`create_model`, through
vit_jax/models/options.py), before anything is built (the config's one validation, naming the
keys `config.model.*`), and in the ViT module itself (one built without `create_model`).
"""

from typing import Any, Callable, Dict, Mapping, Tuple

import ml_dtypes
import numpy as np

from vit_jax.errors import UserError
from vit_jax.models import attention as attention_lib

CLASSIFIERS = ('token', 'gap', 'unpooled', 'map')
POSEMBS = ('learned', 'sincos2d', 'none')
# Rematerialisation of each encoder block: nothing saved ('full'), or only the outputs of the
# matmuls without batch dimensions, i.e. the Dense layers ('dots'; attention matmuls recomputed).
# 'gelu' rematerialises no block: only the MLP's GELU, whose output the backward pass recomputes
# from the first Dense's output (one [B, N, mlp_dim] tensor per block fewer kept for it).
# Values: the names of the policies in `jax.checkpoint_policies` (models/vit.py looks them up).
REMAT_POLICIES = {
    'none': None,
    'full': 'nothing_saveable',
    'dots': 'dots_with_no_batch_dims_saveable',
    'gelu': None,
}

# FlexiViT's position-embedding interpolations: `jax.image.resize` methods (models/flexi.py).
FLEXI_RESIZES = ('bilinear', 'bicubic', 'lanczos3', 'lanczos5', 'nearest')
# option -> its valid values.
CHOICES: Dict[str, Tuple[str, ...]] = {
    'classifier': CLASSIFIERS,
    'posemb': POSEMBS,
    'remat': tuple(REMAT_POLICIES),
    'attention': attention_lib.ATTENTIONS,
    'flexi_resize': FLEXI_RESIZES,
}
_COUNT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, 'an integer >= 0')
# option -> (predicate, what the value must be). A drop-path rate of 1 drops the last block for
# every example (vit.drop_path); a dropout rate of 1 would drop every activation.
RANGES: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    'dropout_rate': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'attention_dropout_rate': (lambda v: 0 <= v < 1, 'in [0, 1)'),
    'stochastic_depth': (lambda v: 0 <= v <= 1, 'in [0, 1]'),
    'num_registers': _COUNT,
    'flexi_patch': _COUNT,  # FlexiViT's stored patch kernel side (0: none)
    'flexi_grid': _COUNT,   # FlexiViT's stored position-embedding grid side (0: none)
}
DTYPES = ('dtype', 'param_dtype')
CHECKED = (*CHOICES, *RANGES, *DTYPES)  # every option `check_values` checks


def check_values(options: Mapping[str, Any], prefix: str = 'model.') -> None:
  """A one-line UserError for the first option of `options` whose value is not valid, naming it
  as `prefix + name`; an attention kernel without dropout must get no attention dropout."""
  for key, value in options.items():
    name = prefix + key
    remat_bool = key == 'remat' and isinstance(value, bool)  # True = 'full', False = 'none'
    if key in CHOICES and not remat_bool and value not in CHOICES[key]:
      raise UserError(f'unknown {key} {value!r}: use {name}= one of {", ".join(CHOICES[key])}')
    if key in RANGES and value is not None:
      ok, what = RANGES[key]
      if not ok(value):
        raise UserError(f'{name}={value!r} is out of range: it must be {what}')
    if key in DTYPES:
      try:
        np.dtype(getattr(ml_dtypes, value, value) if isinstance(value, str) else value)
      except TypeError:
        raise UserError(f'{name}={value!r} is not a dtype: use e.g. float32 or bfloat16') from None
  if options.get('flexi_grid') and options.get('posemb', 'learned') != 'learned':
    raise UserError(f'{prefix}flexi_grid={options["flexi_grid"]} resizes a learned position '
                    f'embedding but {prefix}posemb={options["posemb"]!r}: set '
                    f'{prefix}posemb=learned or {prefix}flexi_grid=0')
  if 'attention' in options:
    attention_lib.check(options['attention'], options.get('attention_dropout_rate', 0.))


__all__ = ['CHECKED', 'CHOICES', 'CLASSIFIERS', 'DTYPES', 'FLEXI_RESIZES', 'POSEMBS', 'RANGES', 'REMAT_POLICIES',
           'check_values']
