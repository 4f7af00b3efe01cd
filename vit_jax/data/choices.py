"""The data keys' valid values, without TensorFlow: `train.validate` checks a config against them
before the pipeline (and TensorFlow, ~3 CPU-s to import) is loaded; `preprocess` and `pipeline`
use the same tuples."""

TRAIN_CROPS = ('inception', 'resize_crop', 'pad_crop', 'resize')  # specs.train_spec
EVAL_CROPS = ('central', 'resize')                                 # specs.eval_spec
SHARDINGS = ('process', 'global')                                  # streams.train_iterator
INPUT_PIPELINES = ('auto', 'tf.data')                              # streams.train_iterator
# What runs recorded before `input_pipeline` existed (before 2026-11-25) streamed through.
RECORDED_INPUT_PIPELINE = 'tf.data'
