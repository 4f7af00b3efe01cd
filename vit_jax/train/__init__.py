"""The trainer: pure steps, losses, optimizers and schedules, and the loop (`train.loop`).

Nothing is imported here: `vit_jax.train.validate` (and lock, logs, guards) load without the loop,
its data pipeline and TensorFlow, so a config mistake is reported before any of them is imported.
"""
