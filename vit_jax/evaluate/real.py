"""ImageNet ReaL (Beyer et al. 2020, the paper's Table 2): top-1 against the reassessed labels.

Reads tfds `imagenet2012_real` (its `validation` split: the ImageNet validation images with a
`real_label` set per image). A prediction counts when it is in the image's set of real labels;
images whose set is empty are not scored, as in the ReaL paper. The dataset must be prepared
(`tfds build imagenet2012_real`, which needs the manually downloaded ImageNet validation tar), or
the ILSVRC2012 archives read in place (vit_jax/data/releases.py) with the ReaL labels' `real.json`
beside them (the validation images in file-name order).
"""

from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import errors
from vit_jax import parallel
from vit_jax.data import catalog
from vit_jax.data import pipeline, specs
from vit_jax.data.sources import imagenet
from vit_jax.data.sources import tfds as tfds_source
from vit_jax.errors import UserError
from vit_jax.parallel import sharding

IMAGE_KEY = 'image'
LABELS_KEY = 'real_label'


def real_hits(logits: jax.Array, label_sets: jax.Array, mask: jax.Array) -> Dict[str, jax.Array]:
  """{'correct', 'count'} sums over a batch; label_sets is 0/1 [B, K], mask [B] (1 = real row)."""
  prediction = jnp.argmax(logits, axis=-1)
  hit = jnp.take_along_axis(label_sets, prediction[:, None], axis=1)[:, 0] > 0
  scored = mask.astype(jnp.float32) * (jnp.sum(label_sets, axis=-1) > 0)
  return {'correct': jnp.sum(hit * scored), 'count': jnp.sum(scored)}


def _label_set_feature(builder, dataset: str, setting: Callable[[str], str]):
  features = builder.info.features if builder is not None else {}
  real = features[LABELS_KEY] if LABELS_KEY in features else None
  if (IMAGE_KEY not in features or not isinstance(real, tfds.features.Sequence)
      or not isinstance(real.feature, tfds.features.ClassLabel)):
    raise UserError(f"dataset '{dataset}' has no '{IMAGE_KEY}' image with a '{LABELS_KEY}' "
                    f'sequence of class labels: use {setting("dataset")}=imagenet2012_real')
  return real.feature.num_classes


class RealEvaluator:
  """`evaluator(params) -> {'accuracy', 'count'}` of a classifier on the ReaL label sets."""

  def __init__(self, *, model, mesh, param_shardings, dataset: str, data_dir: Optional[str],
               split: str, batch_size: int, spec: specs.Spec, cache: bool = True,
               setting: Callable[[str], str] = errors.setting):
    """`spec`: the parsed eval preprocessing (`specs.eval_spec`). `setting(option)`: how the
    running command sets an option of the evaluator, for the hints."""
    self.mesh = mesh
    self._step = self._scoring_step(model, param_shardings)
    pcount, pindex = jax.process_count(), jax.process_index()
    # The ILSVRC2012 archives read in place, with real.json beside them (vit_jax/data/releases.py).
    release = imagenet.real_release(dataset, data_dir)
    if release is not None:
      self._check_classes(model, dataset, len(release.classes))
      self._batches = pipeline.real_label_set_batches(
          release, split, batch_size=batch_size // pcount, spec=spec,
          process_index=pindex, process_count=pcount)
      return
    # (An embedded dataset, read from its arrays, has no label sets.)
    builder = (None if dataset in catalog.EMBEDDED else
               tfds_source.load_builder(dataset, data_dir))
    num_classes = _label_set_feature(builder, dataset, setting)
    self._check_classes(model, dataset, num_classes)
    shares = tfds.even_splits(split, n=pcount)
    try:
      counts = [int(builder.info.splits[s].num_examples) for s in shares]
    except (KeyError, ValueError, AssertionError):
      raise UserError(f"bad split '{split}' for '{dataset}': use one of "
                      f"{', '.join(builder.info.splits.keys())}") from None

    def label_set(example):
      one_hot = tf.one_hot(example[LABELS_KEY], num_classes, dtype=tf.int32)
      return tf.minimum(tf.reduce_sum(one_hot, axis=0), 1)

    local_batch = batch_size // pcount
    records = pipeline.encoded_records(builder, shares[pindex], IMAGE_KEY, label_set, cache=cache)
    self._batches = pipeline.padded_eval_batches(
        records, count=counts[pindex], num_batches=-(-max(counts) // local_batch),
        batch_size=local_batch, spec=spec,
        stored_shape=builder.info.features[IMAGE_KEY].shape, label_shape=(num_classes,))

  @staticmethod
  def _check_classes(model, dataset: str, num_classes: int) -> None:
    if model.num_classes != num_classes:
      raise UserError(f"the model has {model.num_classes} classes but '{dataset}' labels "
                      f'{num_classes}: ReaL scores ImageNet-1k classifiers; leave the ReaL '
                      f'evaluator out for other runs')

  def _scoring_step(self, model, param_shardings):

    def step(params, batch):
      logits = model.apply({'params': params}, batch['image'], train=False)
      return real_hits(logits, batch['label'], batch['mask'])

    return jax.jit(step, in_shardings=(param_shardings, sharding.batch_sharding(self.mesh)),
                   out_shardings=sharding.replicated(self.mesh))

  def __call__(self, params) -> Dict[str, float]:
    totals = None
    for batch in self._batches:
      out = self._step(params, parallel.shard_batch(batch, self.mesh))
      totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    totals = jax.device_get(totals)
    count = float(totals['count'])
    return {'accuracy': float(totals['correct']) / max(count, 1.0), 'count': count}


__all__ = ['RealEvaluator', 'real_hits']
