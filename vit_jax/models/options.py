"""Model options and the one check of them: every value, and how each model family treats them.

The trainer passes `config.model` (classifier, posemb, dropout_rate, dtype, ...) to `create_model`
for every variant, so every family receives every option. An option is a field of some family's
module (`VisionTransformer`, `BiT`); `OPTIONS` lists them all, `DEFAULTS` their defaults.

`check(variant, options)` is the one check, run by `create_model` and, before anything is built,
by the config's one validation (vit_jax/train/validate.py), whose messages name the config key:
- A name that is no family's option is a UserError listing the valid ones.
- A value must be valid for the option (vit_jax/models/option_values.py: one of the tables the
  modules use, within its range, a dtype).
- An option the family's module has is passed to it (type-normalised).
- An option it does not have is accepted, and has no effect, when it holds its default (the
  default of the field that declares it, which is also the default in vit_jax/configs/common.py)
  or the value that describes the family anyway (`IMPLIED`: a ResNet pools globally,
  classifier='gap'). Any other value is a one-line UserError naming the option: a setting that
  would silently do nothing is refused, while every config still runs every model.

The variant's name and the option values are checked from tables alone; the families' fields
(`FAMILIES`, `DEFAULTS`, `OPTIONS`) load Flax on first use, so a wrong name or value is reported
before JAX is imported.
"""

import dataclasses
import functools
from typing import Any, Dict, Mapping, Tuple

from vit_jax import lazy
from vit_jax.errors import UserError
from vit_jax.models import option_values
from vit_jax.models import variants

jnp = lazy.Module('jax.numpy')

# Values of options a family does not have that describe it as it is (family: its class name).
IMPLIED: Dict[str, Dict[str, Any]] = {'BiT': {'classifier': 'gap'},
                                      'MlpMixer': {'classifier': 'gap'}}

_NOT_OPTIONS = ('num_classes', 'parent', 'name')


def _fields(cls: type) -> Dict[str, Any]:
  """Option name -> default (dataclasses.MISSING when the field is required)."""
  return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in _NOT_OPTIONS}


@functools.cache
def _tables() -> Dict[str, Any]:
  """FAMILIES (the module classes), DEFAULTS (every option of every family, in declaration order,
  with the default of its first declaration) and OPTIONS (their names)."""
  # pylint: disable-next=g-import-not-at-top
  from vit_jax.models import bit, mixer, vit  # Flax
  families = (vit.VisionTransformer, bit.BiT, mixer.MlpMixer)
  defaults: Dict[str, Any] = {}
  for cls in families:
    for name, default in _fields(cls).items():
      defaults.setdefault(name, default)
  return {'FAMILIES': families, 'DEFAULTS': defaults, 'OPTIONS': tuple(defaults)}


def __getattr__(name: str):
  if name in ('FAMILIES', 'DEFAULTS', 'OPTIONS'):
    return _tables()[name]
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _normalise(options: Dict[str, Any]) -> Dict[str, Any]:
  """The options as the module's fields take them."""
  out = dict(options)
  if isinstance(out.get('patch_size'), int):
    out['patch_size'] = (out['patch_size'], out['patch_size'])
  if 'patch_size' in out:
    out['patch_size'] = tuple(int(p) for p in out['patch_size'])
  if 'resnet' in out:
    from vit_jax.models import resnet  # pylint: disable=g-import-not-at-top  # Flax
    out['resnet'] = resnet.as_resnet_config(out['resnet'])
  for key in option_values.DTYPES:
    if key in out:
      out[key] = jnp.dtype(out[key]).type
  return out


def _is_neutral(cls: type, key: str, value: Any) -> bool:
  """True if `value` of an option `cls` does not have changes nothing."""
  implied = IMPLIED.get(cls.__name__, {})
  if key in implied and value == implied[key]:
    return True
  default = _tables()['DEFAULTS'][key]
  return default is not dataclasses.MISSING and (value is default or value == default)


def check(variant: str, options: Mapping[str, Any], prefix: str = 'model.'
          ) -> Tuple[type, Dict[str, Any]]:
  """(module class, its kwargs but num_classes) of `variant` with `options` applied, after the
  checks above; messages name an option as `prefix + name` (the config's `config.model.`)."""
  variants.family(variant)  # an unknown name: said before Flax loads
  option_values.check_values(options, prefix)
  cls, kwargs = variants.decode(variant)
  defaults = _tables()['DEFAULTS']
  unknown = sorted(set(options) - set(defaults))
  if unknown:
    raise UserError(f'unknown model option(s) {", ".join(unknown)}: valid are '
                    f'{", ".join(defaults)}')
  own = _fields(cls)
  for key, value in options.items():
    if key not in own and not _is_neutral(cls, key, value):
      implied = IMPLIED.get(cls.__name__, {})
      also = f' or {implied[key]!r}' if key in implied else ''
      keep = (f'leave it at its default {defaults[key]!r}{also}'
              if defaults[key] is not dataclasses.MISSING else 'do not set it')
      raise UserError(f'{prefix}{key}={value!r} does not apply to {variant} (a '
                      f'{cls.__name__}, options: {", ".join(own)}): {keep}')
  kwargs.update(_normalise({k: v for k, v in options.items() if k in own}))
  return cls, kwargs


__all__ = ['DEFAULTS', 'FAMILIES', 'IMPLIED', 'OPTIONS', 'check']
