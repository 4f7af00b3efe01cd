"""Class predictions for image files: `predict(bundle, paths)` -> top-k classes per file.

Files are read and preprocessed exactly as the model's eval images (`Bundle.eval_spec`) and run in
batches of `batch_size`; the last batch is padded so that the model compiles once. Unusable files
(missing, not PNG/JPEG) make the whole call a UserError naming them (up to four). Probabilities
are the softmax of the logits, or the per-class sigmoid for models trained with sigmoid_xent.
"""

from typing import Any, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.serving.bundle import Bundle
from vit_jax.errors import UserError


def predict(bundle: Bundle, paths: Sequence[str], *, batch_size: int = 32,
            top_k: int = 5) -> List[Dict[str, Any]]:
  """[{'file': path, 'top': [{'class': name, 'index': i, 'probability': p}, ...]}] per path,
  most probable first (k = min(top_k, number of classes)). Each path is given back as it came:
  bytes of a name that are not UTF-8 stay Python's surrogate escapes (U+DC80..U+DCFF, written
  `\udce9` by `json.dumps`), which `os.fsencode` turns back into the name's bytes."""
  from vit_jax.data import image_files  # pylint: disable=g-import-not-at-top
  if not paths:
    raise UserError('no images given: pass image files (PNG or JPEG) as arguments')
  if batch_size < 1 or top_k < 1:
    raise UserError(f'--batch_size={batch_size} and --top_k={top_k} must be positive')
  model = bundle.spec.build()

  @jax.jit
  def forward(p, x):
    logits = model.apply({'params': p}, x, train=False)
    if bundle.output == 'sigmoid':
      return jax.nn.sigmoid(logits)
    return jax.nn.softmax(logits, axis=-1)

  params = jax.device_put(bundle.params)
  spec = bundle.eval_spec()
  k = min(top_k, bundle.spec.num_classes)
  results, bad = [], []
  for start in range(0, len(paths), batch_size):
    chunk, images = [], []
    for path in paths[start:start + batch_size]:
      try:
        images.append(image_files.load_one(path, spec, bundle.decode_channels))
        chunk.append(path)
      except UserError as e:  # go on: the error at the end lists every unusable file
        bad.append((image_files.shown(path), str(e)))
    if not chunk:
      continue
    padded = np.zeros((batch_size,) + images[0].shape, np.float32)
    padded[:len(chunk)] = np.stack(images)
    probs = np.asarray(forward(params, jnp.asarray(padded)))[:len(chunk)]
    for path, p in zip(chunk, probs):
      order = np.argsort(-p, kind='stable')[:k]
      results.append({'file': path, 'top': [
          {'class': bundle.class_names[i], 'index': int(i), 'probability': float(p[i])}
          for i in order]})
  if bad:
    raise image_files.unusable(bad)
  return results


def format_text(results: Sequence[Dict[str, Any]]) -> str:
  """One block per file: its path, then '  probability  class' lines (names through
  `one_line`)."""
  lines = []
  for result in results:
    lines.append(one_line(result['file']))
    lines += [f'  {t["probability"]:.4f}  {one_line(t["class"])}' for t in result['top']]
  return '\n'.join(lines)


def one_line(name: str) -> str:
  """A file or class name for a terminal: bytes that are not UTF-8 and control characters (a
  newline, a terminal escape) as backslash escapes (`caf\\xe9`, `a\\nb`), and a backslash of the
  name doubled, so that each name stays on its own line, prints as text and reads back as one
  name (`caf\\\\xe9` is the name spelled with a backslash)."""
  text = name.replace('\\', '\\\\').encode('utf-8', 'surrogateescape').decode(
      'utf-8', 'backslashreplace')
  return ''.join(c if c.isprintable() else c.encode('unicode_escape').decode('ascii')
                 for c in text)
