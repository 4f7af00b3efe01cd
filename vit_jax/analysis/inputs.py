"""What the analyses read: a run's checkpoint (params + stored config), the model it describes,
and input images (image files, or the first eval images of the run's dataset).

Checkpoints are restored as host numpy arrays, whatever device topology wrote them, and only the
`params` of the train state are read (not the optimizer state).
"""

import dataclasses
from typing import Optional, Sequence

import numpy as np

from vit_jax.checkpoint.restore import available_steps, load_checkpoint, load_facts, resolve_checkpoint  # pylint: disable=unused-import
from vit_jax.models.spec import input_channels  # pylint: disable=unused-import
from vit_jax import data as data_lib
from vit_jax import tasks
from vit_jax.data import image_files, ops, specs
from vit_jax.errors import UserError
from vit_jax.formats import npz, weights
from vit_jax.models import layout
from vit_jax.models.spec import ModelSpec, infer_image_size, infer_options


def build_model(config, params):
  """The run's model: variant and options from its config, class count from the head."""
  return tasks.get_task(config).model_spec(params).build()


def load_model(step_dir, *, averaged: bool = False):
  """(model, params in the model's layout, config) of a checkpoint step directory: a run with
  `model.scan` gets its scanned model and its blocks stacked (`load_checkpoint` reads them
  unrolled)."""
  params, config = load_checkpoint(step_dir, averaged=averaged)
  ops.OPS.load_sources(load_facts(step_dir).get('ops') or {}, str(step_dir))
  model = build_model(config, params)
  return model, layout.for_model(params, model), config


def load_params_file(source: str, model_name: Optional[str] = None,
                     size_if_unsaid: Optional[int] = None):
  """(model, params, ModelSpec) of an .npz params file or official weights by name (downloaded
  once): the variant from the name or `model_name`, options and size from the params (the
  weights' size where the file does not say it, a FlexiViT's, else `size_if_unsaid`)."""
  image_size = None
  if weights.is_name(source):
    image_size = weights.lookup(source).image_size
    source, model_name = weights.fetch_as(source, model_name)
  if not model_name:
    raise UserError(f'--checkpoint={source} holds params only: pass the model it was trained as '
                    '(--model, e.g. ViT-B/16)')
  params = npz.load_npz(source)
  if 'head' not in params:
    raise UserError(f'{source} has no head/ params: the attention rollout needs a classifier')
  options = infer_options(params, model_name)
  if not image_size:
    try:
      image_size = infer_image_size(params, model_name, options)
    except UserError:
      if not size_if_unsaid:
        raise
      image_size = size_if_unsaid
  spec = ModelSpec(model_name, int(np.shape(params['head']['kernel'])[-1]), options, image_size,
                   input_channels(params))
  model = spec.build()
  params = npz.fit_to_model(params, model, (spec.image_size, spec.image_size, spec.channels),
                            name=f'{model_name} ({source})')
  return model, params, spec


def load_image_files(paths: Sequence[str], image_size: int, channels: int) -> np.ndarray:
  """PNG/JPEG files -> [B, S, S, channels] float32 in [-1, 1], resized like the eval images."""
  spec = specs.eval_spec('resize', image_size)
  return image_files.load(paths, spec, channels)


def eval_images(config, num_images: int, data_dir: Optional[str] = None,
                image_size: Optional[int] = None):
  """The first `num_images` eval images of the run's dataset and their labels (as evaluated;
  at `image_size` if given, a resize before the crop scaled with it)."""
  spec = specs.eval_spec(config.pp.eval, config.image_size)
  if image_size and image_size != spec.image_size:
    spec = dataclasses.replace(spec, ops=spec.ops.at_size(image_size))
  batches, _ = data_lib.eval_iterator(
      dataset=config.dataset, split=config.eval_split, data_dir=data_dir or config.data_dir,
      batch_size=num_images, spec=spec, cache=False)
  batch = next(iter(batches))
  real = batch['mask'] > 0
  return batch['image'][real], batch['label'][real]


__all__ = ['resolve_checkpoint', 'available_steps', 'load_checkpoint', 'build_model', 'load_model',
           'input_channels', 'load_params_file', 'load_image_files', 'eval_images']
