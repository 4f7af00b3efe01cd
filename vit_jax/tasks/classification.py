"""Classification: the eval step that scores a classifier's logits against integer labels.

(The train step's default objective is classification too: vit_jax/train/step.py; mixup's is
vit_jax/tasks/mixup.py.)
"""

from typing import Callable

from vit_jax import lazy
from vit_jax.tasks import losses

jnp = lazy.Module('jax.numpy')  # imported when a step is traced


def make_eval_step(*, apply_fn: Callable, loss_fn: Callable, num_classes: int):
  """Returns eval_step(params, batch) -> sums of correct, loss and count over unmasked examples."""

  def eval_step(params, batch):
    logits = apply_fn({'params': params}, batch['image'], train=False)
    mask = batch['mask'].astype(jnp.float32)
    targets = losses.one_hot(batch['label'], num_classes)
    hit = (jnp.argmax(logits, -1) == batch['label']).astype(jnp.float32)
    return {'correct': jnp.sum(hit * mask), 'loss': jnp.sum(loss_fn(logits, targets) * mask),
            'count': jnp.sum(mask)}

  return eval_step
