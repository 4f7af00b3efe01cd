"""Scoring an ImageNet classifier on the robustness sets over each set's own classes, as their
authors do (vit_jax/data/sources/robustness.py reads the sets).

The logits of the ImageNet classes outside the set are left out before the argmax (ImageNet-R and
ImageNet-A: their 200 classes; ObjectNet: the ImageNet classes that map to its 113 overlapping
classes); a prediction is right when the ImageNet class it picks maps to the image's class
(`Scoring.to_set`: the identity for the sets labelled with ImageNet classes, ObjectNet's mapping
for ObjectNet, where several ImageNet classes map to one of its classes). An argmax over all 1,000
classes would score these sets far lower, and not as published.

  hits(logits, labels, mask, to_set)   -> {'correct', 'count'} sums over a batch (NumPy or jax)
  RobustnessEvaluator                  params -> {set: top-1} over the sets named
"""

from typing import Dict, Optional, Sequence

import numpy as np

SETS = ('imagenet_v2/matched-frequency', 'imagenet_v2/threshold-0.7', 'imagenet_v2/topimages',
        'imagenet_r', 'imagenet_a', 'imagenet_sketch', 'objectnet')


def hits(logits, labels, mask, to_set, xp=np) -> Dict:
  """{'correct', 'count'} over a batch: logits [B, 1000], labels [B] (the set's classes), mask
  [B] (1 = a real image), to_set [1000] (the set's class of each ImageNet class, -1 outside
  the set); `xp` is numpy or jax.numpy."""
  to_set = xp.asarray(to_set)
  restricted = xp.where(to_set[None, :] >= 0, logits, -xp.inf)
  predicted = to_set[xp.argmax(restricted, axis=-1)]
  mask = xp.asarray(mask, xp.float32)
  return {'correct': xp.sum((predicted == xp.asarray(labels)) * mask), 'count': xp.sum(mask)}


def set_names(sets: str) -> Sequence[str]:
  """'all' or names joined by '+' -> the set names; ValueError naming an unknown one."""
  names = SETS if sets == 'all' else tuple(s for s in sets.split('+') if s)
  unknown = [n for n in names if n not in SETS]
  if unknown or not names:
    raise ValueError(f'unknown robustness set {(unknown or [sets])[0]!r}: use all, or names '
                     f'joined by + from {", ".join(SETS)}')
  return names


class RobustnessEvaluator:
  """`evaluator(params) -> {set: top-1}` of a 1,000-class ImageNet classifier on the sets."""

  def __init__(self, *, model, mesh, param_shardings, sets: Sequence[str],
               data_dir: Optional[str], batch_size: int, spec, cache: bool = True):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from vit_jax import data as data_lib  # pylint: disable=g-import-not-at-top
    from vit_jax.data.sources import robustness  # pylint: disable=g-import-not-at-top
    from vit_jax.errors import UserError  # pylint: disable=g-import-not-at-top
    from vit_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
    if model.num_classes != 1000:
      raise UserError(f'the robustness sets score 1,000-class ImageNet classifiers, not a model '
                      f'of {model.num_classes} classes: leave robustness out of config.evals')
    self.mesh, self.sets = mesh, {}
    pcount, pindex = jax.process_count(), jax.process_index()
    for name in sets:
      info = data_lib.get_info(name, data_dir)
      # A set read from its release carries its scoring; tfds's copy of it is scored by name.
      scored = getattr(info.source, 'scoring', None) or robustness.scoring(name)
      to_set = scored.to_set
      batches, _ = data_lib.eval_iterator(info=info, split='test', batch_size=batch_size // pcount,
                                          spec=spec, process_index=pindex, process_count=pcount,
                                          cache=cache)
      self.sets[name] = (batches, jnp.asarray(to_set))

    def step(params, batch, to_set):
      logits = model.apply({'params': params}, batch['image'], train=False)
      return hits(logits, batch['label'], batch['mask'], to_set, xp=jnp)

    self._step = jax.jit(step, in_shardings=(param_shardings, sharding.batch_sharding(mesh),
                                             sharding.replicated(mesh)),
                         out_shardings=sharding.replicated(mesh))

  def __call__(self, params) -> Dict[str, float]:
    import jax  # pylint: disable=g-import-not-at-top
    from vit_jax import parallel  # pylint: disable=g-import-not-at-top
    out = {}
    for name, (batches, to_set) in self.sets.items():
      correct = count = 0.0
      for batch in batches:
        sums = jax.device_get(self._step(params, parallel.shard_batch(batch, self.mesh), to_set))
        correct, count = correct + float(sums['correct']), count + float(sums['count'])
      out[name] = correct / max(count, 1.0)
    return out


__all__ = ['RobustnessEvaluator', 'SETS', 'hits', 'set_names']
