"""What a run optimises and how it is scored, chosen by `config.loss` and `config.mixup`.

  softmax_xent | sigmoid_xent   classification of the dataset's labels (with mixup if set)
  mpp                           masked patch prediction (train/mpp.py): self-supervised, the
                                labels are not used; the model gets a per-token colour head

The trainer asks this module for the model options, the train objective and the eval step, so the
loop and the step stay the same for every task.
"""

from typing import Callable, Optional

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.train import losses, mixup, mpp, step as step_lib

MPP = 'mpp'
CHOICES = tuple(sorted(losses.LOSSES)) + (MPP,)


def _is_mpp(config) -> bool:
  if config.loss not in CHOICES:
    raise UserError(f'unknown loss {config.loss!r}: use --config.loss= one of {", ".join(CHOICES)}')
  return config.loss == MPP


def model_overrides(config) -> dict:
  """Model options the task imposes (on top of config.model)."""
  return dict(classifier='unpooled', with_mask_token=True) if _is_mpp(config) else {}


def uses_labels(config) -> bool:
  """Whether the run learns the dataset's labels (masked patch prediction does not)."""
  return not _is_mpp(config)


def num_outputs(config, num_classes: int, channels: int) -> int:
  """Head width: the dataset's classes, or the 8**channels colours of masked patch prediction."""
  return mpp.num_colour_classes(channels) if _is_mpp(config) else num_classes


def loss_fn(config) -> Callable:
  return losses.softmax_xent if _is_mpp(config) else losses.get_loss(config.loss)


def metric_name(config) -> str:
  """What the eval step's 'accuracy' measures, for the log lines."""
  return 'masked-patch colour accuracy' if _is_mpp(config) else 'top-1 accuracy'


def _geometry(model, image_size: int):
  grid = models.token_grid(model, image_size)
  return grid, (image_size // grid[0], image_size // grid[1])


def objective(config, model, num_classes: int) -> Optional[Callable]:
  """The train step's objective; None = the step's default classification objective."""
  if _is_mpp(config):
    grid, pixels = _geometry(model, config.image_size)
    mpp.check(config, grid)
    return mpp.make_objective(config, apply_fn=model.apply, grid=grid, patch_pixels=pixels)
  if config.mixup:
    return mixup.classification_objective(
        apply_fn=model.apply, loss_fn=loss_fn(config), num_classes=num_classes,
        label_smoothing=config.label_smoothing, alpha=config.mixup)
  return None


def eval_step(config, model, num_classes: int) -> Callable:
  if _is_mpp(config):
    grid, pixels = _geometry(model, config.image_size)
    return mpp.make_eval_step(config, apply_fn=model.apply, grid=grid, patch_pixels=pixels)
  return step_lib.make_eval_step(apply_fn=model.apply, loss_fn=loss_fn(config),
                                 num_classes=num_classes)


__all__ = ['CHOICES', 'eval_step', 'loss_fn', 'metric_name', 'model_overrides', 'num_outputs',
           'objective', 'uses_labels']
