"""What a run optimises and how it is scored: one `Task`, chosen once from `config.loss`.

  softmax_xent | sigmoid_xent   classification of the dataset's labels (with mixup if set)
  mpp                           masked patch prediction (tasks/mpp.py): self-supervised, the
                                labels are not used; the model gets a per-token colour head

`get_task(config)` resolves it once per run (the config's one validation,
vit_jax/train/validate.py, returns it) and the run passes that object on: the program and its
steps, the loop's log lines and the train command. Bundles and exports (the model a checkpoint
needs), predict and the analyses resolve it once from the checkpoint's config and build through
the same methods (`Task.build_model`, `Task.model_spec`), so the model a task trains is the model
that serves it. This package sits below `train` and `serving`: it imports only `models` and its
own modules.
"""

import dataclasses
from typing import Callable, Optional

import numpy as np

from vit_jax import models
from vit_jax.errors import UserError
from vit_jax.models.spec import ModelSpec, input_channels
from vit_jax.tasks import classification, losses, mixup, mpp

MPP = 'mpp'
CHOICES = tuple(sorted(losses.LOSSES)) + (MPP,)


@dataclasses.dataclass(frozen=True)
class Task:
  """One task of a config. `name` is `config.loss`; the config is kept for the objectives'
  options (label smoothing, mixup, the MPP corruption)."""
  name: str
  config: object = dataclasses.field(repr=False, compare=False)

  @property
  def is_mpp(self) -> bool:
    return self.name == MPP

  @property
  def uses_labels(self) -> bool:
    """Whether the run learns the dataset's labels (masked patch prediction does not)."""
    return not self.is_mpp

  @property
  def model_overrides(self) -> dict:
    """Model options the task imposes on top of `config.model` (training and serving alike)."""
    return dict(classifier='unpooled', with_mask_token=True) if self.is_mpp else {}

  @property
  def metric_name(self) -> str:
    """What the eval step's 'accuracy' measures, for the log lines."""
    return 'masked-patch colour accuracy' if self.is_mpp else 'top-1 accuracy'

  @property
  def output(self) -> str:
    """How a served model turns logits into scores."""
    return 'sigmoid' if self.name == 'sigmoid_xent' else 'softmax'

  @property
  def loss_fn(self) -> Callable:
    return losses.softmax_xent if self.is_mpp else losses.get_loss(self.name)

  def model_options(self, options: dict) -> dict:
    """`options` (the config's `model` section) with the task's overrides applied."""
    return {**options, **self.model_overrides}

  def num_outputs(self, num_classes: int, channels: int) -> int:
    """Head width: the dataset's classes, or the 8**channels colours of masked patch prediction."""
    return mpp.num_colour_classes(channels) if self.is_mpp else num_classes

  def _geometry(self, model):
    grid = models.token_grid(model, self.config.image_size)
    return grid, (self.config.image_size // grid[0], self.config.image_size // grid[1])

  def objective(self, model, num_classes: int) -> Optional[Callable]:
    """The train step's objective; None = the step's default classification objective."""
    c = self.config
    if self.is_mpp:
      grid, pixels = self._geometry(model)
      mpp.check(c, grid)
      return mpp.make_objective(c, apply_fn=model.apply, grid=grid, patch_pixels=pixels)
    if c.mixup:
      return mixup.classification_objective(
          apply_fn=model.apply, loss_fn=self.loss_fn, num_classes=num_classes,
          label_smoothing=c.label_smoothing, alpha=c.mixup)
    return None

  def eval_step(self, model, num_classes: int) -> Callable:
    """eval_step(params, batch) -> sums of 'correct', 'loss' and 'count' over unmasked rows."""
    if self.is_mpp:
      grid, pixels = self._geometry(model)
      return mpp.make_eval_step(self.config, apply_fn=model.apply, grid=grid, patch_pixels=pixels)
    return classification.make_eval_step(apply_fn=model.apply, loss_fn=self.loss_fn,
                                         num_classes=num_classes)

  def build_model(self, num_classes: int):
    """The one rule from a config to its model: the variant, `config.model` and the task's
    overrides (training builds its model with it, `model_spec` describes it for serving)."""
    c = self.config
    return models.create_model(c.model_name, num_classes=num_classes,
                               **self.model_options(c.model.to_dict()))

  def model_spec(self, params) -> ModelSpec:
    """The `ModelSpec` of a training run's checkpoint: the model `build_model` trained, with the
    class count and input channels read from `params`."""
    c = self.config
    num_classes = int(np.shape(params['head']['kernel'])[-1])
    if c.num_classes and c.num_classes != num_classes:
      raise UserError(f'config.num_classes={c.num_classes} but the checkpoint head has '
                      f'{num_classes} outputs: the checkpoint and its config do not match')
    options = self.model_options(c.model.to_dict())
    # The attention kernel is picked where the model runs, not stored: a TPU run's 'flash' could
    # not run on a CPU host (the spec builds 'auto').
    options.pop('attention', None)
    return ModelSpec(model_name=c.model_name, num_classes=num_classes, options=options,
                     image_size=int(c.image_size), channels=input_channels(params))


def get_task(config) -> Task:
  """The task of a config (an unknown `loss`: one line listing the choices)."""
  if config.loss not in CHOICES:
    raise UserError(f'unknown loss {config.loss!r}: use config.loss= one of {", ".join(CHOICES)}')
  return Task(name=config.loss, config=config)


__all__ = ['CHOICES', 'MPP', 'Task', 'get_task']
