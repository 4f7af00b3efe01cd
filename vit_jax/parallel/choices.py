"""The parallelism key's valid values, without JAX: `train.validate` checks a config against them
before JAX is loaded; `parallel.steps` dispatches on the same tuple."""

PARALLELISMS = ('jit', 'pmap')
