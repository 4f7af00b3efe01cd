"""What the analyses read: a run's checkpoint (params + stored config), the model it describes,
and input images (image files, or the first eval images of the run's dataset).

Checkpoints are restored as host numpy arrays, whatever device topology wrote them, and only the
`params` of the train state are read (not the optimizer state).
"""

from typing import Optional, Sequence

import numpy as np

from vit_jax.checkpoint.restore import available_steps, load_checkpoint, resolve_checkpoint
from vit_jax.errors import UserError


def build_model(config, params):
  """The run's model: variant and options from its config, class count from the head."""
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  head_classes = int(np.shape(params['head']['kernel'])[-1])
  num_classes = config.num_classes or head_classes
  if num_classes != head_classes:
    raise UserError(f'config.num_classes={config.num_classes} but the checkpoint head has '
                    f'{head_classes} outputs: the checkpoint and its config do not match')
  return loop.build_model(config, num_classes)


def input_channels(params) -> int:
  """Image channels the model was trained on (from its first conv kernel)."""
  first = params['conv_root'] if 'conv_root' in params else params['embedding']
  return int(np.shape(first['kernel'])[2])


def load_image_files(paths: Sequence[str], image_size: int, channels: int) -> np.ndarray:
  """PNG/JPEG files -> [B, S, S, channels] float32 in [-1, 1], resized like the eval images."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from vit_jax.data import pipeline, preprocess  # pylint: disable=g-import-not-at-top
  pipeline.hide_accelerators_from_tf()
  spec = preprocess.EvalSpec(crop='resize', image_size=image_size)
  images = []
  for path in paths:
    if not tf.io.gfile.exists(path):
      raise UserError(f'cannot read image {path}: no such file; pass PNG or JPEG files')
    try:
      with tf.io.gfile.GFile(path, 'rb') as f:
        encoded = f.read()
    except (tf.errors.OpError, OSError) as e:
      raise UserError(f'cannot read image {path}: {_first_line(e)}; pass PNG or JPEG files') \
          from None
    try:
      image = preprocess.decode(tf.constant(encoded), channels)
      images.append(preprocess.eval_preprocess(image, spec).numpy())
    except (tf.errors.InvalidArgumentError, ValueError) as e:
      raise UserError(f'cannot decode image {path} ({_first_line(e)}): pass PNG or JPEG files') \
          from None
  return np.stack(images).astype(np.float32)


def eval_images(config, num_images: int, data_dir: Optional[str] = None):
  """The first `num_images` eval images of the run's dataset and their labels (as evaluated)."""
  from vit_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  batches, _ = data_lib.eval_iterator(
      dataset=config.dataset, split=config.eval_split, data_dir=data_dir or config.data_dir,
      batch_size=num_images, pp=loop._eval_pp(config), cache=False)  # pylint: disable=protected-access
  batch = next(iter(batches))
  real = batch['mask'] > 0
  return batch['image'][real], batch['label'][real]


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return ' '.join(text[0].split()) if text else type(error).__name__


__all__ = ['resolve_checkpoint', 'available_steps', 'load_checkpoint', 'build_model',
           'input_channels', 'load_image_files', 'eval_images']
