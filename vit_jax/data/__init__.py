"""Input data: tfds datasets, preprocessing ops and per-process tf.data pipelines.

  get_info(dataset, data_dir)       -> DatasetInfo (num_classes, image_shape, num_examples(split))
  train_iterator(dataset=..., ...)  -> infinite, exactly resumable iterator of numpy batches
  eval_iterator(dataset=..., ...)   -> (re-iterable padded + masked batches, num_batches)

Modules: `mnist5k` (the embedded 5,000-image MNIST dataset), `info` (finding prepared datasets,
never downloading), `preprocess` (TF image ops), `pipeline` (tf.data train/eval streams).

Importing this package registers the `mnist5k` tfds builder (that is its one side effect).
"""

from vit_jax.data import mnist5k
from vit_jax.data import preprocess
from vit_jax.data.info import DatasetInfo
from vit_jax.data.info import get_info
from vit_jax.data.pipeline import SHARDINGS
from vit_jax.data.pipeline import EvalBatches
from vit_jax.data.pipeline import eval_iterator
from vit_jax.data.pipeline import hide_accelerators_from_tf
from vit_jax.data.pipeline import train_iterator

__all__ = [
    'DatasetInfo', 'EvalBatches', 'eval_iterator', 'get_info', 'hide_accelerators_from_tf',
    'mnist5k', 'preprocess', 'train_iterator', 'SHARDINGS',
]
