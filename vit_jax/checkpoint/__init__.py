"""Training checkpoints: the orbax train state with its data-iterator position and config
(`train_ckpt`), which step directory a command reads, found before JAX loads (`steps`), reading
a run's params back for analysis, transfer and serving (`restore`), and the one check of a stored
config against the states of vit_jax that wrote it (`versions`).

Foreign files (the released .npz layouts, timm .safetensors) are in `vit_jax.formats`; bundles,
specs and inference in `vit_jax.serving`. Importing this package imports neither JAX nor orbax:
`Checkpointer` loads its module on first use.
"""

from vit_jax import lazy

__getattr__ = lazy.attributes(__name__, {'Checkpointer': 'train_ckpt'})

__all__ = ['Checkpointer']
