"""Input data: where images come from, how they are preprocessed, and the per-process streams.

  get_info(dataset, data_dir)       -> DatasetInfo (num_classes, image_shape, num_examples(split))
  train_iterator(dataset=..., ...)  -> infinite, exactly resumable iterator of numpy batches
  eval_iterator(dataset=..., ...)   -> (re-iterable padded + masked batches, num_batches)

Modules, by role:
  sources        `embedded` with `mnist5k` and `digits` (datasets inside installed packages),
                 `folder` (a folder of class folders) and `releases` (ImageNet-21k and
                 ILSVRC2012), both read in place over `archive_index` (the index of an archive
                 or folder), `image_files` (single image files, for prediction);
  catalog/info   `catalog` (the embedded datasets' facts and split expressions, no TensorFlow),
                 `info` (which source serves a name; tfds datasets, never downloading),
                 `offline_info` (tfds info of the datasets built here);
  preprocessing  `choices` (the data keys' valid values), `specs` (what preprocessing is asked
                 for), `config_pp` (a config's specs), `preprocess` and `randaug` (TF ops);
  streams        `streams` (which pipeline serves a dataset), `pipeline` (tf.data train/eval
                 streams), `arrays` (NumPy streams of the embedded datasets, no TensorFlow).

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
