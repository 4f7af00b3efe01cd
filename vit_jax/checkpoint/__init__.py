"""Training checkpoints: the orbax train state with its data-iterator position and config
(`train_ckpt`), and reading a run's params back for analysis, transfer and serving (`restore`).

Foreign files (the released .npz layouts, timm .safetensors) are in `vit_jax.formats`; bundles,
specs and inference in `vit_jax.serving`.
"""

from vit_jax.checkpoint.train_ckpt import Checkpointer

__all__ = ['Checkpointer']
