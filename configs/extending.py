"""The base mnist5k recipe with a preprocessing op and an evaluator of its own, each one registered
function.

Run:
  python -m vit_jax.main --config=configs/extending.py --workdir=runs/extending

`brightness` shifts every pixel of a training image by one random amount, drawn from the
example's own seed (the run stays exactly resumable); `confidence` logs the mean top softmax
probability on the eval split (split `confidence` of metrics.jsonl) at every evaluation.
Registered when this file is loaded, they are checked by the config validation like the built-in
ones (docs/data.md, docs/evaluation.md). Arguments as configs/mnist5k.py's.
"""

import jax
import jax.numpy as jnp

from vit_jax import lazy
from vit_jax.configs import mnist5k
from vit_jax.data import ops
from vit_jax.evaluate import registry

tf = lazy.Module('tensorflow')  # imported when the op first runs, not when the config is read


@ops.register('brightness', random=True)
def brightness(image, ctx, delta=32):
  """Adds one random amount in [-delta, delta] to every pixel (clipped to [0, 255])."""
  shift = tf.random.stateless_uniform([], ctx.seed, -delta, delta + 1, dtype=tf.int32)
  return tf.clip_by_value(tf.cast(image, tf.int32) + shift, 0, 255)


@registry.register('confidence')
def confidence(run):
  """The mean top softmax probability on the eval split."""
  batches = run.eval_batches()

  @jax.jit
  def sums(params, batch):
    probs = jax.nn.softmax(run.model.apply({'params': params}, batch['image'], train=False))
    return jnp.sum(probs.max(-1) * batch['mask']), jnp.sum(batch['mask'])

  def evaluate(params):
    total = count = 0.0
    for batch in batches:
      top, n = sums(params, run.shard(batch))
      total, count = total + float(top), count + float(n)
    return {'confidence': total / count}

  return registry.Evaluation(evaluate)


def get_config(arg: str | None = None):
  c = mnist5k.get_config(arg)
  c.pp.train = 'pad_crop(pad=2)|brightness(delta=40)'
  c.evals.confidence = dict(type='confidence')  # at every evaluation (every: unset)
  return c
