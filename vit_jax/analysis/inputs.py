"""What the analyses read: a run's checkpoint (params + stored config), the model it describes,
and input images (image files, or the first eval images of the run's dataset).

Checkpoints are restored as host numpy arrays, whatever device topology wrote them, and only the
`params` of the train state are read (not the optimizer state).
"""

from typing import Optional, Sequence, Tuple

import jax
import ml_collections
import numpy as np
from etils import epath

from vit_jax.errors import UserError


def resolve_checkpoint(workdir: Optional[str], checkpoint: Optional[str] = None) -> epath.Path:
  """The step directory (holding `state/` and `config/`) named by --workdir/--checkpoint.

  `checkpoint` is None (the newest step in `<workdir>/checkpoints`), a step number, or the path
  of a step directory (`<workdir>/checkpoints/<step>`, or its `state` subdirectory).
  """
  checkpoint = None if checkpoint in (None, '') else str(checkpoint)
  if checkpoint is not None and not checkpoint.isdigit():
    path = epath.Path(checkpoint)
    if path.name == 'state':
      path = path.parent
    if not (path / 'state').is_dir() or not (path / 'config').is_dir():
      raise UserError(f'--checkpoint={checkpoint} is not a checkpoint step directory (one holding '
                      f'state/ and config/, e.g. WORKDIR/checkpoints/1600): pass such a path or '
                      f'a step number with --workdir')
    return path
  if not workdir:
    raise UserError('missing --workdir: pass --workdir=DIR of a training run (or '
                    '--checkpoint=WORKDIR/checkpoints/STEP)')
  root = epath.Path(workdir)
  if not root.is_dir():
    raise UserError(f'--workdir={workdir} does not exist: pass the --workdir of a training run')
  steps = available_steps(root)
  if not steps:
    raise UserError(f'no checkpoints in {root / "checkpoints"}: train first (python -m '
                    f'vit_jax.main --workdir={workdir} ...) or pass another --workdir')
  if checkpoint is None:
    return root / 'checkpoints' / str(steps[-1])
  if int(checkpoint) not in steps:
    raise UserError(f'no checkpoint for step {int(checkpoint)} in {root / "checkpoints"}: '
                    f'available steps are {", ".join(map(str, steps))}')
  return root / 'checkpoints' / str(int(checkpoint))


def available_steps(workdir) -> list[int]:
  """Steps with a finished checkpoint in `<workdir>/checkpoints` (orbax temp dirs skipped)."""
  directory = epath.Path(workdir) / 'checkpoints'
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and (p / 'state').is_dir() and (p / 'config').is_dir())


def load_checkpoint(step_dir) -> Tuple[dict, ml_collections.ConfigDict]:
  """(params as numpy arrays, the run's config) of one checkpoint step directory."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step_dir = epath.Path(step_dir)
  with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
    config = ml_collections.ConfigDict(ckptr.restore(step_dir / 'config'))
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
    tree = ckptr.metadata(step_dir / 'state').item_metadata.tree
    if 'params' not in tree:
      raise UserError(f'{step_dir / "state"} holds no params (keys: {", ".join(tree)}): pass a '
                      f'checkpoint written by vit_jax.main')
    item = {'params': tree['params']}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    restored = ckptr.restore(step_dir / 'state', args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
  return restored['params'], config


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
  from vit_jax.train import program  # pylint: disable=g-import-not-at-top
  batches, _ = data_lib.eval_iterator(
      dataset=config.dataset, split=config.eval_split, data_dir=data_dir or config.data_dir,
      batch_size=num_images, pp=program.eval_pp(config), cache=False)
  batch = next(iter(batches))
  real = batch['mask'] > 0
  return batch['image'][real], batch['label'][real]


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return ' '.join(text[0].split()) if text else type(error).__name__


__all__ = ['resolve_checkpoint', 'available_steps', 'load_checkpoint', 'build_model',
           'input_channels', 'load_image_files', 'eval_images']
