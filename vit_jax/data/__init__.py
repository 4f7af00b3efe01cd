"""Input data: where images come from, how they are preprocessed, and the per-process streams.

  get_info(dataset, data_dir)       -> DatasetInfo (num_classes, image_shape, num_examples(split)),
                                       resolved once per run and passed on
  train_iterator(info=..., ...)     -> infinite, exactly resumable iterator of numpy batches
  eval_iterator(info=..., ...)      -> (re-iterable padded + masked batches, num_batches)

Modules, by role:
  sources        `sources/` (one module per source, chosen by name: `embedded`, `folder`,
                 `imagenet`, `tfds`, `vtab`, `robustness`, or a config file's own; one
                 `Source` interface), over the readers: `embedded` with `mnist5k` and `digits`
                 (datasets inside installed packages), `folder` (a folder of class folders) and
                 `releases` (ImageNet-21k and ILSVRC2012), both read in place over
                 `vit_jax.data.archive` (the index of an archive or folder), `image_files`
                 (single image files, for prediction);
  catalog/info   `catalog` (the embedded datasets' arrays and split expressions, no TensorFlow),
                 `info` (a name's `DatasetInfo`, holding its source; tfds builders, never
                 downloading), `identity` (what a checkpoint records of its data),
                 `offline_info` (tfds info of the datasets built here);
  preprocessing  `ops` (the preprocessing ops, registered by name), `randaug` (RandAugment's
                 ops), `specs` (a config's op lists, parsed once and checked),
                 `preprocess` (the ops run on one image), `choices` (valid values);
  streams        `streams` (the arguments checked), `pipeline` (the tf.data train/eval streams
                 every source feeds).

Importing this package imports neither tfds nor TensorFlow: the names load their module on first
use, so config validation (which reads `choices`, `specs` and the op registry) does not import
them.
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
