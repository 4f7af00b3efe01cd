"""Starting a run from a pre-trained checkpoint (`config.init`): the paper's transfer rules.

`config.init` names a training workdir (its newest checkpoint), one checkpoint step directory
(`<workdir>/checkpoints/<step>`), an .npz file in any layout `load_npz` reads, or official weights
by name (`ViT-B/16@imagenet21k`; `python -m vit_jax weights` lists them). Every parameter of
the new model is taken from the checkpoint, except (ViT paper, §3.2, App. B.1.1; the original
`checkpoint.py`):

  head        the new model's own freshly initialised head (zero kernel) for the new class count
  pre_logits  dropped, unless the new model has one (config.model.representation_size set): then
              it is loaded and must have the same width
  mask_token  dropped (masked patch prediction pre-training only)
  posemb      resized when the patch grids differ: the cls row (if any) is kept, the grid rows
              are interpolated in 2-D (`models.posemb_resize.resize_posemb`, which predict,
              bundles and the analyses use too), non-square grids included

A parameter of the new model missing from the checkpoint, or with another shape, is a UserError
naming it. `transfer_params` works on numpy arrays; the trainer calls `read_init` at step 0 of a
new run, before it compiles anything, and `apply_init` once the initial state exists.
"""

import dataclasses
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np
from etils import epath

from vit_jax import models
from vit_jax.models import layout
from vit_jax.models import vit as vit_lib
from vit_jax.models import spec as model_spec
from vit_jax.models.posemb_resize import Grid, resize_posemb, square_grid
from vit_jax.formats import npz as npz_lib
from vit_jax.formats import weights
from vit_jax.checkpoint import restore
from vit_jax.errors import UserError

HEAD = 'head/'
PRE_LOGITS = 'pre_logits/'
PRETRAIN_ONLY = ('mask_token',)  # parameters that exist only for a pre-training objective


# ---------------------------------------------------------------------------------------------
# Which parameters come from the checkpoint (pure).


def _describe(keys) -> str:
  keys = sorted(keys)
  return ', '.join(keys[:3]) + (f' and {len(keys) - 3} more' if len(keys) > 3 else '')


def transfer_params(loaded: Mapping[str, Any], target: Mapping[str, Any], *, has_cls: bool,
                    old_grid: Optional[Grid], new_grid: Grid, method: str = 'bilinear',
                    what: str = 'config.init checkpoint') -> Dict[str, np.ndarray]:
  """The checkpoint values of the new model's parameters, as a flat {'a/b/kernel': array} dict.

  `loaded` and `target` are nested trees (target leaves only need .shape and .dtype). The result
  has every target key except the head (and except pre_logits when the target has none); the
  caller keeps its fresh values for those. `old_grid` None means: infer a square grid. `what`
  names the checkpoint in errors.
  """
  _check_channels(loaded, target, what)
  got = npz_lib._flatten(loaded)  # pylint: disable=protected-access
  want = npz_lib._flatten(target)  # pylint: disable=protected-access
  fresh = {k for k in want if k.startswith(HEAD)}
  dropped = {k for k in got if k.startswith(HEAD) or k.split('/')[0] in PRETRAIN_ONLY
             or (k.startswith(PRE_LOGITS) and not any(w.startswith(PRE_LOGITS) for w in want))}
  missing = [k for k in want if k not in got and k not in fresh]
  if missing:
    hint = ('the new model has a pre_logits layer but the checkpoint has none: unset '
            'config.model.representation_size' if any(k.startswith(PRE_LOGITS) for k in missing)
            else 'start from a checkpoint of the same model (variant, classifier, posemb)')
    raise UserError(f'{what} lacks {_describe(missing)} of the new model: {hint}')
  unexpected = [k for k in got if k not in want and k not in dropped]
  if unexpected:
    raise UserError(f'{what} has {_describe(unexpected)}, which the new model '
                    f'lacks: start from a checkpoint of the same model (variant, classifier, '
                    f'posemb)')
  out = {}
  for key, spec in want.items():
    if key in fresh:
      continue
    value = np.asarray(got[key])
    if key == npz_lib.POSEMB and value.shape != tuple(spec.shape):
      grid = old_grid or square_grid(value.shape[1] - int(has_cls))
      value = resize_posemb(value, grid, new_grid, has_cls=has_cls, method=method)
    if value.shape != tuple(spec.shape):
      raise UserError(f'config.init parameter {key} has shape {value.shape} but the new model '
                      f'needs {tuple(spec.shape)}: start from a checkpoint of the same variant'
                      + (' and config.model.representation_size' if
                         key.startswith(PRE_LOGITS) else ''))
    out[key] = value.astype(spec.dtype)
  return out


def _input_channels(params) -> Optional[int]:
  try:
    return model_spec.input_channels(params)
  except UserError:  # no input kernel: the other checks name what is missing
    return None


def _check_channels(loaded, target, what: str) -> None:
  """Same model, other image channels (an RGB checkpoint for a grayscale dataset): said as such,
  with the setting that converts this run's images."""
  have, want = _input_channels(loaded), _input_channels(target)
  if have is not None and want is not None and have != want:
    raise UserError(f'{what} was trained on {have}-channel images and this run feeds '
                    f'{want}-channel ones: end config.pp.train and config.pp.eval with '
                    f'channels({have}) '
                    f'(images are converted: '
                    f'grayscale tiled to RGB, RGB to its luma), or start from a checkpoint '
                    f'trained on {want}-channel images')


# ---------------------------------------------------------------------------------------------
# Reading the checkpoint that config.init names.


@dataclasses.dataclass
class Pretrained:
  params: Dict[str, Any]  # nested numpy tree
  grid: Optional[Grid]    # the patch grid it was trained at, when known
  source: str             # what was read, for the log


def load_pretrained(init: str) -> Pretrained:
  """Reads the params of an .npz, official weights by name (`ViT-B/16@imagenet21k`: downloaded
  once, formats/weights.py), a checkpoint step directory or a workdir's newest checkpoint."""
  if weights.is_name(init):  # the file must hold the name's model, as for predict
    path = weights.fetch_checked(init)
    return Pretrained(npz_lib.load_npz(path), None, f'{init} ({path})')
  if init.endswith('.npz'):
    return Pretrained(npz_lib.load_npz(init), None, init)
  path = epath.Path(init)
  if not path.is_dir():
    raise UserError(f'config.init={init} is neither an .npz file nor a directory: pass a '
                    f'training workdir, a checkpoint step directory or an .npz file')
  if (path / 'checkpoints').is_dir() or not (path / 'state').is_dir():
    workdir, step = str(path), None  # its newest healthy step, a damaged newer one passed over
  else:
    workdir, step = None, str(path)
  params, config, step_dir = restore.read_step(
      workdir, step, lambda d: (*restore.load_checkpoint(d, flags=restore.INIT), d),
      flags=restore.INIT)
  return Pretrained(params, _trained_grid(config), str(step_dir))


def _trained_grid(config) -> Optional[Grid]:
  """The grid the checkpoint's run used (from its stored config), if that config decodes."""
  try:
    model = models.create_model(config.model_name, num_classes=1)
    return models.token_grid(model, int(config.image_size))
  except (UserError, AttributeError, KeyError, TypeError, ValueError):
    return None


# ---------------------------------------------------------------------------------------------
# The trainer's one call.


def _put(value: np.ndarray, sharding) -> jax.Array:
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


@dataclasses.dataclass
class Transfer:
  """The values a new run starts from: flat 'a/b/c' -> numpy array, in the new model's layout."""
  values: Dict[str, np.ndarray]
  source: str  # what was read, for the log


def read_init(init: str, params, *, model, image_size: int, method: str) -> Transfer:
  """Reads `init` and fits it to the new model's parameters (see the module rules).

  `params` is the new model's parameter tree, arrays or ShapeDtypeStructs: the trainer calls this
  with the abstract state, before any program is compiled, so a missing path or a checkpoint of
  another model is a UserError at once (not after the initial state and the train step compiled).
  The checkpoint's params (always read unrolled) take the model's encoder layout (stacked for
  `model.scan`).
  """
  pretrained = load_pretrained(init)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  values = transfer_params(pretrained.params, layout.unstack_blocks(abstract),
                           has_cls=vit_lib.has_cls(model.classifier), old_grid=pretrained.grid,
                           new_grid=models.token_grid(model, image_size), method=method,
                           what=f'config.init={init}')
  if layout.is_stacked(abstract):  # a scanned model: its blocks stacked as its params are
    tree = layout.stack_blocks(npz_lib._unflatten(values))  # pylint: disable=protected-access
    values = npz_lib._flatten(tree)  # pylint: disable=protected-access
  return Transfer(values, pretrained.source)


def apply_init(transfer: Transfer, state, *, tx, shardings):
  """`state` with its params taken from `transfer` and a fresh optimizer state.

  `state` is the freshly initialised TrainState; `shardings` its shardings. The head (and any
  other parameter the checkpoint does not provide) keeps its fresh value.
  """
  values = transfer.values

  def pick(path, fresh, sharding):
    key = '/'.join(str(getattr(p, 'key', p)) for p in path)
    return _put(values[key], sharding) if key in values else fresh

  params = jax.tree_util.tree_map_with_path(pick, state.params, shardings.params)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  return state.replace(params=params, opt_state=opt_state)


__all__ = ['Pretrained', 'Transfer', 'apply_init', 'load_pretrained', 'read_init',
           'transfer_params']
