"""The data keys' valid values, without TensorFlow: `train.validate` checks a config against them
before the pipeline (and TensorFlow, slow to import) is loaded; `preprocess` and `pipeline`
use the same tuples."""

TRAIN_CROPS = ('inception', 'resize_crop', 'pad_crop', 'resize')  # specs.train_spec
EVAL_CROPS = ('central', 'resize')                                 # specs.eval_spec
SHARDINGS = ('process', 'global')                                  # streams.train_iterator
INPUT_PIPELINES = ('auto', 'tf.data')                              # streams.train_iterator
# What runs whose recorded config has no `input_pipeline` key streamed through.
RECORDED_INPUT_PIPELINE = 'tf.data'
