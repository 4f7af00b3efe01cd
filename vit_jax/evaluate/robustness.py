"""Scoring an ImageNet classifier on the robustness sets over each set's own classes, as their
authors do (vit_jax/data/sources/robustness.py reads the sets).

The logits of the ImageNet classes outside the set are left out before the argmax (ImageNet-R and
ImageNet-A: their 200 classes; ObjectNet: the ImageNet classes that map to its 113 overlapping
classes); a prediction is right when the ImageNet class it picks maps to the image's class
(`Scoring.to_set`: the identity for the sets labelled with ImageNet classes, ObjectNet's mapping
for ObjectNet, where several ImageNet classes map to one of its classes). An argmax over all 1,000
classes would score these sets far lower, and not as published.

  correct(logits, labels, to_set)       -> bool [N]
  Tally                                 accumulates batches {'logits', 'label', 'mask'} -> top-1
"""

import numpy as np


def correct(logits: np.ndarray, labels: np.ndarray, to_set: np.ndarray) -> np.ndarray:
  """Whether each row's prediction over the set's classes is its label: logits [N, 1000],
  labels [N] (the set's classes), to_set [1000] (the set's class of each ImageNet class, -1
  outside the set)."""
  logits = np.asarray(logits, np.float64)
  to_set = np.asarray(to_set)
  if logits.shape[-1] != len(to_set):
    raise ValueError(f'logits of {logits.shape[-1]} classes, but the set maps {len(to_set)} '
                     f'ImageNet classes: score a 1,000-class ImageNet classifier')
  inside = to_set >= 0
  restricted = np.where(inside[None, :], logits, -np.inf)
  return to_set[np.argmax(restricted, axis=-1)] == np.asarray(labels)


class Tally:
  """Top-1 over batches of one set: `add(logits, labels, mask)` per batch, `top1` at the end."""

  def __init__(self, to_set: np.ndarray):
    self.to_set = np.asarray(to_set)
    self.right = self.count = 0.0

  def add(self, logits, labels, mask) -> None:
    mask = np.asarray(mask, np.float64)
    self.right += float(np.sum(correct(logits, labels, self.to_set) * mask))
    self.count += float(np.sum(mask))

  @property
  def top1(self) -> float:
    if not self.count:
      raise ValueError('no image was scored')
    return self.right / self.count


__all__ = ['Tally', 'correct']
