"""The optimizer keys' valid values, without JAX: `train.validate` checks a config against them
before JAX and optax are loaded; `train.optim` dispatches on the same tuples."""

OPTIMIZERS = ('adam', 'sgd')
DECAY_TYPES = ('linear', 'cosine')
WEIGHT_DECAY_MASKS = ('kernels', 'all')
