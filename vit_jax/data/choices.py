"""The data keys' valid values, without TensorFlow: `train.validate` checks a config against them
before the pipeline (and TensorFlow, slow to import) is loaded; `streams` uses the same tuple.
(The preprocessing ops are checked against their registry, vit_jax/data/ops.py.)"""

SHARDINGS = ('process', 'global')                                  # streams.train_iterator
