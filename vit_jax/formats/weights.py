"""Official pre-trained weights by name: `ViT-B/16@imagenet21k` -> a local copy of the released
file, downloaded once.

  ViT-{B/16,B/32,L/16,L/32,H/14}, R50+ViT-B/16 @imagenet21k    gs://vit_models/imagenet21k/...
  ViT-{B/16,B/32,L/16,L/32}, R50+ViT-B/16 @imagenet21k+imagenet2012 (fine-tuned at 384 px;
    ViT-B/16 and ViT-L/16 also @imagenet21k+imagenet2012-224)  gs://vit_models/imagenet21k+imagenet2012/
  the AugReg paper's recommended models (the original README's table; AugReg paper, Table 3):
    NAME@augreg-i21k (pre-trained 300 epochs on ImageNet-21k) and NAME@augreg-i21k+imagenet2012
    (then fine-tuned at 384 px) for ViT-Ti/16, S/16, S/32, B/16, B/32, L/16, R+ViT-Ti/16,
    R26+ViT-S/32, R50+ViT-L/32                                  gs://vit_models/augreg/...
  FlexiViT (Beyer et al. 2023; big_vision's "FlexiViT-B i1k", ...): ViT-{S,B,L}/16@flexivit-i1k
    (distilled on ImageNet-1k), ViT-B/16@flexivit-i21k-{90,300,1000}ep (ImageNet-21k), 240 px;
    their stored kernel PI-resized to patch 16 or any --patch_size   gs://big_vision/flexivit/...
  MLP-Mixer (Mixer paper, Table 3): Mixer-{B,L}/16@imagenet1k (pre-trained on ImageNet-1k, 1000
    classes) and Mixer-{B,L}/16@imagenet21k (ImageNet-21k, 21843 classes), 224 px
                                                                gs://mixer_models/imagenet{1k,21k}/...

Files are fetched from $VIT_JAX_WEIGHTS_URL (default https://storage.googleapis.com/vit_models, the
public address of gs://vit_models; a file:// URL points at a local mirror) into $VIT_JAX_WEIGHTS_DIR
(default ~/.cache/vit_jax/weights), at the bucket's relative path, and later used from there without
the network. Files of another bucket (big_vision's, the Mixer's) are fetched from
https://storage.googleapis.com/BUCKET, or from $VIT_JAX_WEIGHTS_URL/BUCKET when it is set, and
kept under BUCKET/ in the cache. A download is written to a hidden temporary file and renamed only
once complete: its size must equal the Content-Length the server announced and it must be a whole
.npz (zip) file, so a killed or cut download never leaves a file that looks complete. Without a network, one error line
names the file's address and where to put it by hand.
"""

import dataclasses
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from typing import Dict, Optional, Tuple

import numpy as np

from vit_jax.errors import UserError
from vit_jax.fileio import is_remote
from vit_jax.formats import files

URL_VAR, DIR_VAR = 'VIT_JAX_WEIGHTS_URL', 'VIT_JAX_WEIGHTS_DIR'
DEFAULT_URL = 'https://storage.googleapis.com/vit_models'
BUCKET = 'gs://vit_models'  # the original's weights; `Weights.bucket` names others
TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class Weights:
  name: str        # e.g. ViT-B/16@imagenet21k
  path: str        # relative to the bucket, e.g. imagenet21k/ViT-B_16.npz
  model_name: str  # the variant of this codebase it is
  note: str        # what it is trained on, at what resolution
  bucket: str = 'vit_models'          # the gs:// bucket of `path`
  image_size: Optional[int] = None    # the input size, where the file does not give it (FlexiViT)


def _file_stem(model: str) -> str:
  return model.replace('/', '_')  # ViT-B/16 -> ViT-B_16, R50+ViT-B/16 -> R50+ViT-B_16


def _augreg_stem(model: str) -> str:
  # R50+ViT-L/32 -> R50_L_32, R+ViT-Ti/16 -> R_Ti_16, ViT-B/16 -> B_16
  hybrid, _, vit = model.rpartition('+')
  return (f'{hybrid}_' if hybrid else '') + vit[len('ViT-'):].replace('/', '_')


# AugReg: the recommended i21k upstream (augmentation, weight decay, dropout, stochastic depth)
# and the learning rate of its ImageNet fine-tuning (the original README's table).
_AUGREG = {
    'ViT-L/16': ('strong1', '0.1', '0.0', '0.0', '0.01'),
    'ViT-B/16': ('medium1', '0.1', '0.0', '0.0', '0.03'),
    'ViT-S/16': ('light1', '0.03', '0.0', '0.0', '0.03'),
    'R50+ViT-L/32': ('medium1', '0.1', '0.1', '0.1', '0.01'),
    'R26+ViT-S/32': ('light1', '0.1', '0.0', '0.0', '0.01'),
    'ViT-Ti/16': ('none', '0.03', '0.0', '0.0', '0.03'),
    'ViT-B/32': ('light1', '0.1', '0.0', '0.0', '0.01'),
    'ViT-S/32': ('none', '0.1', '0.0', '0.0', '0.01'),
    'R+ViT-Ti/16': ('none', '0.03', '0.0', '0.0', '0.03'),
}


# FlexiViT's released files (big_vision's VANITY_NAMES): size, source, what it is.
_FLEXIVIT = (
    ('S', 'i1k', 'distilled on ImageNet-1k, 1000 classes'),
    ('B', 'i1k', 'distilled on ImageNet-1k, 1000 classes'),
    ('L', 'i1k', 'distilled on ImageNet-1k, 1000 classes'),
    ('B', 'i21k-90ep', 'ImageNet-21k 90 epochs, 21843 classes'),
    ('B', 'i21k-300ep', 'ImageNet-21k 300 epochs, 21843 classes'),
    ('B', 'i21k-1000ep', 'ImageNet-21k 1000 epochs, 21843 classes'),
)


def _registry() -> Dict[str, Weights]:
  out = {}

  def add(name, path, model, note, **kwargs):
    out[name] = Weights(name, path, model, note, **kwargs)

  for model in ('ViT-B/16', 'ViT-B/32', 'ViT-L/16', 'ViT-L/32', 'ViT-H/14', 'R50+ViT-B/16'):
    add(f'{model}@imagenet21k', f'imagenet21k/{_file_stem(model)}.npz', model,
        'ImageNet-21k, 224 px, 21843 classes (with pre_logits)')
  for model in ('ViT-B/16', 'ViT-B/32', 'ViT-L/16', 'ViT-L/32', 'R50+ViT-B/16'):
    add(f'{model}@imagenet21k+imagenet2012', f'imagenet21k+imagenet2012/{_file_stem(model)}.npz',
        model, 'ImageNet-21k, fine-tuned on ImageNet at 384 px, 1000 classes')
  for model in ('ViT-B/16', 'ViT-L/16'):
    add(f'{model}@imagenet21k+imagenet2012-224',
        f'imagenet21k+imagenet2012/{_file_stem(model)}-224.npz', model,
        'ImageNet-21k, fine-tuned on ImageNet at 224 px, 1000 classes')
  for model, (aug, wd, do, sd, lr) in _AUGREG.items():
    stem = f'{_augreg_stem(model)}-i21k-300ep-lr_0.001-aug_{aug}-wd_{wd}-do_{do}-sd_{sd}'
    add(f'{model}@augreg-i21k', f'augreg/{stem}.npz', model,
        'AugReg: ImageNet-21k 300 epochs, 224 px, 21843 classes')
    add(f'{model}@augreg-i21k+imagenet2012',
        f'augreg/{stem}--imagenet2012-steps_20k-lr_{lr}-res_384.npz', model,
        'AugReg: then fine-tuned on ImageNet at 384 px, 1000 classes')
  for size, source, note in _FLEXIVIT:
    add(f'ViT-{size}/16@flexivit-{source}',
        f'flexivit/flexivit_{size.lower()}_{source.replace("-", "_")}.npz', f'ViT-{size}/16',
        f'FlexiViT: {note}, 240 px, any patch size (--patch_size)', bucket='big_vision',
        image_size=240)
  for model in ('Mixer-B/16', 'Mixer-L/16'):
    for source, note in (('imagenet1k', 'ImageNet-1k, 224 px, 1000 classes'),
                         ('imagenet21k', 'ImageNet-21k, 224 px, 21843 classes')):
      add(f'{model}@{source}', f'{source}/{_file_stem(model)}.npz', model, f'MLP-Mixer: {note}',
          bucket='mixer_models')
  return out


KNOWN = _registry()


def is_name(text: Optional[str]) -> bool:
  """True for text that names weights (`MODEL@SOURCE`), known or not (then `lookup` says so)."""
  return bool(text) and '@' in text and not os.path.exists(text) and not is_remote(text)


def unknown_source(source: str, flag: str = '--weights') -> UserError:
  """The line for weights given as `flag` that are no released name and no file."""
  return UserError(f'{flag}={source} is neither a released name (python -m vit_jax weights '
                   f'lists them) nor a params file')


def lookup(name: str) -> Weights:
  if name not in KNOWN:
    model = name.partition('@')[0]
    close = sorted(n for n in KNOWN if n.startswith(model + '@')) or sorted(KNOWN)[:4]
    raise UserError(f'unknown weights {name!r}: known names include {", ".join(close)} '
                    f'(python -m vit_jax weights lists all {len(KNOWN)})')
  return KNOWN[name]


def base_url(bucket: str = 'vit_models') -> str:
  if bucket == 'vit_models':
    return os.environ.get(URL_VAR, DEFAULT_URL).rstrip('/')
  mirror = os.environ.get(URL_VAR)
  return f'{mirror.rstrip("/")}/{bucket}' if mirror else f'https://storage.googleapis.com/{bucket}'


def cache_dir() -> str:
  return os.path.expanduser(os.environ.get(DIR_VAR) or '~/.cache/vit_jax/weights')


def _bucket_path(weights: Weights) -> str:
  """`path` relative to the cache and the mirror: other buckets' under their name."""
  return weights.path if weights.bucket == 'vit_models' else f'{weights.bucket}/{weights.path}'


def local_path(weights: Weights) -> str:
  return os.path.join(cache_dir(), *_bucket_path(weights).split('/'))


def url(weights: Weights) -> str:
  return f'{base_url(weights.bucket)}/{weights.path}'


def fetch(name: str) -> str:
  """The local path of the weights `name`, downloaded first if they are not in the cache. A cached
  file that is not a whole .npz (cut short, damaged) is downloaded again, with a note. A failed
  download leaves no file and no directory it created."""
  weights = lookup(name)
  path = local_path(weights)
  if os.path.isfile(path):
    if zipfile.is_zipfile(path):
      return path
    print(f'note: the cached file {path} is not a whole .npz file; downloading it again',
          file=sys.stderr, flush=True)
    os.remove(path)
  address = url(weights)
  by_hand = (f'download {address} (gs: gs://{weights.bucket}/{weights.path}) by hand to {path}, '
             f'or point {URL_VAR} at a mirror')
  created = _missing_ancestor(os.path.dirname(path))
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
  except OSError as e:
    raise UserError(f'cannot create the weights cache {os.path.dirname(path)} ({e.strerror or e})'
                    f': set {DIR_VAR} to a writable directory') from None
  # A download killed before (SIGKILL) left its partial file: a live one would have written to
  # it or timed out within TIMEOUT_S.
  files.remove_stale_temps(path, idle_s=2 * TIMEOUT_S)
  try:
    with urllib.request.urlopen(address, timeout=TIMEOUT_S) as response:
      expected = response.headers.get('Content-Length')
      files.atomic_write(path, lambda f: _copy_checked(response, f, expected, address))
  except UserError:
    _remove_empty(os.path.dirname(path), created)
    raise
  except (urllib.error.URLError, OSError, ValueError) as e:
    _remove_empty(os.path.dirname(path), created)
    reason = getattr(e, 'reason', None) or getattr(e, 'strerror', None) or e
    raise UserError(f'cannot download {name} ({reason}): {by_hand}') from None
  return path


def _missing_ancestor(directory: str) -> Optional[str]:
  """The outermost directory of `directory`'s chain that does not exist yet (None if it does)."""
  missing = None
  while directory and not os.path.isdir(directory):
    missing, parent = directory, os.path.dirname(directory)
    if parent == directory:
      break
    directory = parent
  return missing


def _remove_empty(directory: str, up_to: Optional[str]) -> None:
  """Removes the empty directories this fetch created, from `directory` up to `up_to`."""
  if up_to is None:
    return
  while True:
    try:
      os.rmdir(directory)
    except OSError:
      return
    if directory == up_to:
      return
    directory = os.path.dirname(directory)


def _copy_checked(response, f, expected: Optional[str], address: str) -> None:
  """Streams the download into `f`; a short or broken file raises, so it is never renamed."""
  shutil.copyfileobj(response, f, length=1 << 20)
  f.flush()
  got = f.tell()
  if expected is not None and got != int(expected):
    raise UserError(f'the download of {address} stopped after {got} of {expected} bytes '
                    '(nothing was kept): run the command again')
  if not zipfile.is_zipfile(f.name):
    raise UserError(f'{address} is not an .npz (zip) file ({got} bytes): check {URL_VAR}')


def check_model(name: str, path: str, *, other_fix: str = '') -> None:
  """A UserError unless the .npz at `path` (the file of the weights `name`) has the width and
  depth of the name's own variant (the released files' `Transformer/encoder_norm/scale` and
  `encoderblock_{i}` names; a Mixer's `pre_head_layer_norm/scale` and `MixerBlock_{i}`): a mirror serving another model's file under the name is said so,
  not taken for an image-size question or a checkpoint of another model. `other_fix` is the
  caller's other way out (predict: pass --model)."""
  from vit_jax.formats import npz  # pylint: disable=g-import-not-at-top
  from vit_jax.models import variants  # pylint: disable=g-import-not-at-top
  weights = lookup(name)
  want = variants.decode_variant(weights.model_name)
  if 'hidden_size' not in want:
    return
  mixer = 'tokens_mlp_dim' in want  # the Mixer's final norm and blocks, else the ViT's
  norm, block = (('pre_head_layer_norm/scale', 'MixerBlock_') if mixer else
                 ('Transformer/encoder_norm/scale', 'Transformer/encoderblock_'))
  with np.load(path) as data:
    # Names under big_vision's `params/` prefix too, its encoder maybe scanned ([L, ...]).
    names = list(data.keys())
    prefix = next((p for p in npz.PREFIXES if any(n.startswith(p) for n in names)), '')
    names = [n[len(prefix):] for n in names if n.startswith(prefix)]
    width = int(data[prefix + norm].shape[-1]) if norm in names else None
    scanned = [n for n in names if n.startswith(npz.SCANNED)]
    stacked = int(data[prefix + scanned[0]].shape[0]) if scanned else None
  blocks = {n[len(block):].split('/')[0] for n in names if n.startswith(block)}
  depth = len(blocks) or stacked
  if (width, depth) != (want['hidden_size'], want['num_layers']):
    raise UserError(f'{path} holds another model (width {width}, {depth} blocks), not '
                    f'{weights.name} ({weights.model_name}: width {want["hidden_size"]}, '
                    f'{want["num_layers"]} blocks): delete it and fix the mirror at ${URL_VAR} '
                    f'({base_url(weights.bucket)}){other_fix}')


def fetch_checked(name: str, *, other_fix: str = '') -> str:
  """`fetch(name)`, the file checked to hold the name's own model (`check_model`): what a caller
  that takes the model from the name uses (config.init, and `fetch_as`)."""
  path = fetch(name)
  check_model(name, path, other_fix=other_fix)
  return path


def fetch_as(name: str, model_name: Optional[str] = None) -> Tuple[str, str]:
  """(local file, variant) of the weights `name` read as `model_name` (--model of predict,
  convert, analyze); without one, as the name's own variant, which the file must hold."""
  if model_name:
    return fetch(name), model_name
  return (fetch_checked(name, other_fix=', or pass --model with the variant the file holds'),
          lookup(name).model_name)


def resolve(text: Optional[str]) -> Optional[str]:
  """`text` itself, or the local file of the weights it names (downloaded once)."""
  return fetch(text) if is_name(text) else text


def model_name(text: Optional[str]) -> Optional[str]:
  """The variant that the weights `text` names are, or None when `text` is not a name."""
  return lookup(text).model_name if is_name(text) else None


def listing() -> str:
  """The known names, their files and where each is (or would be) cached."""
  lines = []
  for w in KNOWN.values():
    here = 'cached' if os.path.isfile(local_path(w)) else 'not downloaded'
    lines.append(f'{w.name:40s} {w.note}; gs://{w.bucket}/{w.path} ({here})')
  lines.append(f'cache: {cache_dir()} (${DIR_VAR}); source: {base_url()} (${URL_VAR})')
  return '\n'.join(lines)


__all__ = ['KNOWN', 'Weights', 'base_url', 'cache_dir', 'check_model', 'fetch', 'fetch_as',
           'fetch_checked', 'is_name', 'listing', 'local_path', 'lookup', 'model_name', 'resolve',
           'unknown_source', 'url']
