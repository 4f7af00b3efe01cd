"""Input data: tfds datasets, preprocessing ops and per-process input pipelines.

  get_info(dataset, data_dir)       -> DatasetInfo (num_classes, image_shape, num_examples(split))
  train_iterator(dataset=..., ...)  -> infinite, exactly resumable iterator of numpy batches
  eval_iterator(dataset=..., ...)   -> (re-iterable padded + masked batches, num_batches)

Modules: `mnist5k` and `digits` (the embedded datasets), `info` (finding prepared datasets,
never downloading), `specs` (what preprocessing is asked for), `preprocess` (TF image ops),
`streams` (which pipeline serves a dataset), `pipeline` (tf.data train/eval streams), `arrays`
(NumPy streams of the embedded datasets, no TensorFlow), `choices` (the valid values of the data
keys).

Importing this package imports neither tfds nor TensorFlow: the names load their module on first
use, so `vit_jax.data.choices` (what config validation reads) and a run on the NumPy streams do
not import them. The embedded datasets' tfds builders are defined (and registered with tfds) on
first use (`mnist5k.prepare`, `mnist5k.Mnist5k`; embedded.py).
"""

from vit_jax import lazy

from vit_jax.data import mnist5k

# name -> the module that defines it (submodules, `data.preprocess` etc., load by their own name)
_HOMES = {
    'DatasetInfo': 'info', 'get_info': 'info', 'SHARDINGS': 'choices',
    'EvalBatches': 'pipeline', 'eval_iterator': 'streams',
    'hide_accelerators_from_tf': 'preprocess', 'train_iterator': 'streams',
}


__getattr__ = lazy.attributes(__name__, _HOMES)


__all__ = sorted([*_HOMES, 'mnist5k', 'preprocess'])
