"""The pure train and eval steps. No I/O, no globals: jitted once by the loop.

`train_step(state, batch, rng, hyper) -> (state, metrics)`; the batch is the global batch (images
[B,H,W,C] in [-1,1], int labels [B]); `hyper` holds the run's learning rate, schedule and weight
decay as float32 scalars (`optim.hyperparameters`), arguments rather than constants of the
program, so that runs differing only in them share one compiled step. Gradient accumulation
splits it into `accum_steps` micro-batches, each a strided slice so that every device keeps
working on its own rows.

The same step serves both parallel paths. Under `jax.jit` with shardings (`reduce_axis=None`) it
sees the global batch and XLA inserts the reductions. As a per-device program (the 'pmap' path,
`reduce_axis='data'`) it sees this device's rows; gradients and loss are averaged with `pmean`
and correct counts summed with `psum` over that axis before the (replicated) optimizer update,
and each device folds its index into the dropout RNG.

fp8 (`model.fp8`, vit_jax/models/fp8.py): the state is an `Fp8TrainState`, whose `fp8` holds the
dense layers' scales and amax histories. The step differentiates with respect to them as well and
takes their "gradients" as their new values (flax's overwrite-with-gradient convention); only the
params' gradients reach the optimizer, the clipping and the norms. Micro-batches pass the state
on from one to the next, the 'pmap' path takes its maximum over the devices (every amax is a
maximum), and a skipped step keeps the old state.
"""

from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import optax

from vit_jax.models import fp8 as fp8_lib
from vit_jax.tasks import losses


@flax.struct.dataclass
class TrainState:
  step: jax.Array     # int32 scalar: steps taken
  params: Any
  opt_state: Any
  skipped: jax.Array  # int32 scalar: steps whose loss or gradient was NaN/Inf and were skipped

  @classmethod
  def create(cls, params, tx: optax.GradientTransformation, fp8=None) -> 'TrainState':
    """Step 0: `params` and a fresh optimizer state (the counters are int32 arrays, so every
    step sees the same argument types and the step compiles once); an `Fp8TrainState` when the
    model has fp8 state (`fp8`, from `init`)."""
    zero = jnp.zeros((), jnp.int32)
    fields = dict(step=zero, params=params, opt_state=tx.init(params), skipped=zero)
    return Fp8TrainState(**fields, fp8=fp8) if fp8 else TrainState(**fields)


@flax.struct.dataclass
class Fp8TrainState(TrainState):
  """A TrainState with the fp8 layers' scales and amax histories (vit_jax/models/fp8.py): a
  class of its own, so that the states (and checkpoints) of every other model keep their tree."""
  fp8: Any = None


def fp8_state(state: TrainState):
  """The fp8 state of `state`, {} for a model without fp8 layers."""
  return state.fp8 if isinstance(state, Fp8TrainState) else {}


def _l2(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def make_train_step(*, apply_fn: Callable, optimizer: Callable, loss_fn: Callable,
                    num_classes: int, label_smoothing: float, accum_steps: int,
                    reduce_axis: Optional[str] = None,
                    skip_nonfinite: bool = False, objective: Optional[Callable] = None):
  """Returns the pure train step for this model, optimizer and loss (see the module docstring).

  `optimizer(hyper) -> (optax transformation, lr schedule)` (`optim.from_hyperparameters`) is
  called inside the step with its `hyper` argument; its state must not depend on `hyper`.

  `objective(variables, images, labels, rng) -> (mean loss, number correct)` replaces the
  default classification objective (mixup: tasks/mixup.py; masked patch prediction:
  tasks/mpp.py); `variables` is what the model's `apply` takes (the params, and the fp8 state
  where there is one).
  Every step reports `nonfinite` (1.0 if its loss or gradient norm is NaN/Inf). With
  `skip_nonfinite`, such a step leaves parameters and optimizer state unchanged (the step count
  still advances, so the data stream moves on) and increments `state.skipped`.
  """

  def loss_and_logits(variables, images, labels, rng):
    logits = apply_fn(variables, images, train=True, rngs={'dropout': rng})
    targets = losses.one_hot(labels, num_classes, label_smoothing)
    return jnp.mean(loss_fn(logits, targets)), logits

  def correct(logits, labels):
    return jnp.sum(jnp.argmax(logits, -1) == labels)

  def classification(variables, images, labels, rng):
    loss, logits = loss_and_logits(variables, images, labels, rng)
    return loss, correct(logits, labels)

  def params_objective(params, fp8, images, labels, rng):
    return (objective or classification)(fp8_lib.variables(params, fp8), images, labels, rng)

  # (gradient of the params, the fp8 state's next value)
  grad_fn = jax.value_and_grad(params_objective, argnums=(0, 1), has_aux=True)

  def train_step(state: TrainState, batch, rng, hyper):
    tx, schedule = optimizer(hyper)
    rng = jax.random.fold_in(rng, state.step)
    if reduce_axis is not None:
      rng = jax.random.fold_in(rng, jax.lax.axis_index(reduce_axis))
    images, labels = batch['image'], batch['label']
    fp8 = fp8_state(state)
    if accum_steps == 1:
      (loss, n_correct), (grads, new_fp8) = grad_fn(state.params, fp8, images, labels, rng)
    else:
      def micro(x):  # [B, ...] -> [accum, B/accum, ...]; micro-batch i = rows i, i+a, i+2a, ...
        return jnp.swapaxes(x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:]), 0, 1)

      def body(carry, xs):
        grads, loss, n_correct, fp8 = carry
        i, im, lab = xs
        (l, c), (g, fp8) = grad_fn(state.params, fp8, im, lab, jax.random.fold_in(rng, i))
        grads = jax.tree.map(jnp.add, grads, g)
        return (grads, loss + l, n_correct + c, fp8), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (grads, loss, n_correct, new_fp8), _ = jax.lax.scan(
          body, (zeros, 0.0, 0, fp8), (jnp.arange(accum_steps), micro(images), micro(labels)))
      grads = jax.tree.map(lambda g: g / accum_steps, grads)
      loss = loss / accum_steps
    count = labels.shape[0]
    if reduce_axis is not None:
      grads, loss = jax.lax.pmean((grads, loss), reduce_axis)
      n_correct, count = jax.lax.psum((n_correct, count), reduce_axis)
      new_fp8 = jax.lax.pmax(new_fp8, reduce_axis)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = _l2(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    skipped = state.skipped
    if skip_nonfinite:
      keep_old = lambda new, old: jnp.where(finite, new, old)
      params = jax.tree.map(keep_old, params, state.params)
      opt_state = jax.tree.map(keep_old, opt_state, state.opt_state)
      new_fp8 = jax.tree.map(keep_old, new_fp8, fp8)
      skipped = skipped + (1 - finite.astype(jnp.int32))
    metrics = {
        'loss': loss,
        'accuracy': n_correct / count,
        'lr': schedule(state.step),
        'grad_norm': grad_norm,
        'param_norm': _l2(params),
        'update_norm': _l2(updates),
        'nonfinite': 1.0 - finite.astype(jnp.float32),
    }
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state, skipped=skipped)
    return (new.replace(fp8=new_fp8) if fp8 else new), metrics

  return train_step
