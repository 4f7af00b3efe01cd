"""vit_jax: Vision Transformer and hybrid models, one trainer, exact to the original."""
