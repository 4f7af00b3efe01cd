"""The trainer: pure steps, losses, optimizers and schedules, and the loop."""

from vit_jax.train.loop import train_and_evaluate

__all__ = ['train_and_evaluate']
