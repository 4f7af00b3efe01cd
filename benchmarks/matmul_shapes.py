"""XLA:CPU's matmuls against PyTorch's at the shapes of one ViT train step, alternated in one
process: where the compiled step loses to timm at the kernel level (needs torch:
`make test-interop`).

  PYTHONPATH=. .venv/bin/python benchmarks/matmul_shapes.py --model=ViT-Ti/16 --batch_size=32

Two kinds of shape, each forward and as the backward pass computes it:
  dense    the Dense layers on the flattened rows, [B*N, D] x [D, F] (q/k/v and out: F = D; the
           MLP: F = mlp_dim), and the kernel gradient x^T dy (contracting the rows)
  batched  the attention core over B*heads matrices of N tokens x head_dim: Q K^T, weights V,
           and the backward's weights^T dY (contracting the query axis)
Each shape is a jitted `jnp.einsum` (fp32, the default threads) and the same `torch.einsum`
(which runs it as a matmul or bmm on transposed views; `torch.get_num_threads()` threads), timed
in turn `--rounds` times, `--calls` calls each; prints the median milliseconds and GFLOP/s of each
side and the ratio, with the processor.
"""

import statistics
from typing import List, Tuple

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.tools.benchmarking import ours as ours_lib
from vit_jax.platform import cpus
from vit_jax.models import vit

# (name, einsum, lhs shape, rhs shape) of one layer, built by `shapes`.
Shape = Tuple[str, str, Tuple[int, ...], Tuple[int, ...]]


def shapes(model: str, batch: int, image_size: int) -> List[Shape]:
  """The matmuls of one encoder layer of `model` at `batch` x `image_size` px."""
  module = models.create_model(model, num_classes=1)
  if getattr(module, 'resnet', None) is not None or not hasattr(module, 'num_heads'):
    raise app.UsageError(f'{model} is not a plain ViT: give one (a hybrid\'s encoder has the same '
                         'shapes)')
  d, heads, mlp = module.hidden_size, module.num_heads, module.mlp_dim
  gh, gw = vit.token_grid(module, image_size)
  tokens = gh * gw + 1
  rows, bh, hd = batch * tokens, batch * heads, d // heads
  return [
      ('dense x W (q/k/v, out)', 'rd,df->rf', (rows, d), (d, d)),
      ('dense x^T dy (kernel grad)', 'rd,rf->df', (rows, d), (rows, d)),
      ('MLP x W', 'rd,df->rf', (rows, d), (d, mlp)),
      ('MLP x^T dy (kernel grad)', 'rd,rf->df', (rows, d), (rows, mlp)),
      ('attention Q K^T', 'bqd,bkd->bqk', (bh, tokens, hd), (bh, tokens, hd)),
      ('attention weights V', 'bqk,bkd->bqd', (bh, tokens, tokens), (bh, tokens, hd)),
      ('attention weights^T dY', 'bqk,bqd->bkd', (bh, tokens, tokens), (bh, tokens, hd)),
  ]


def flops(spec: str, lhs: Tuple[int, ...], rhs: Tuple[int, ...]) -> float:
  """2 x the product of every distinct axis of the einsum (multiply-adds)."""
  ins, _ = spec.split('->')
  sizes = {}
  for names, shape in zip(ins.split(','), (lhs, rhs)):
    sizes.update(zip(names, shape))
  return 2.0 * float(np.prod(list(sizes.values())))


def _define_flags() -> None:
  """The command's flags, defined only when it runs: importing `shapes` and `flops` (the tests
  do) adds nothing to absl's global flags."""
  flags.DEFINE_string('model', 'ViT-Ti/16', 'A ViT variant (its width, heads, MLP).')
  flags.DEFINE_integer('batch_size', 32, 'Images per step.')
  flags.DEFINE_integer('image_size', 224, 'Image side in pixels.')
  flags.DEFINE_integer('rounds', 3, 'Alternations of the two sides.')
  flags.DEFINE_integer('calls', 10, 'Timed calls per side per round.')


def main(argv):
  del argv
  f = flags.FLAGS
  jax.config.update('jax_platforms', 'cpu')  # this CPU's XLA (no accelerator probing)
  import torch  # pylint: disable=g-import-not-at-top  # optional: make test-interop
  rng = np.random.default_rng(0)
  print(f'processor: {cpus.one_line(cpus.describe())}; torch threads '
        f'{torch.get_num_threads()}')
  print(f'{f.model}, batch {f.batch_size}, {f.image_size} px: one layer\'s matmuls, '
        f'median of {f.calls} calls x {f.rounds} rounds')
  print('| matmul | einsum | XLA ms | XLA GFLOP/s | torch ms | torch GFLOP/s | XLA / torch speed |')
  print('|---|---|---|---|---|---|---|')
  for name, spec, lhs, rhs in shapes(f.model, f.batch_size, f.image_size):
    a = rng.standard_normal(lhs, dtype=np.float32)
    b = rng.standard_normal(rhs, dtype=np.float32)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ours = jax.jit(lambda x, y, s=spec: jnp.einsum(s, x, y))
    theirs = lambda s=spec: torch.einsum(s, ta, tb)  # a matmul/bmm on transposed views
    xla, tch = [], []
    for r in range(f.rounds):  # the first round warms both sides up
      xla.append(1e3 * ours_lib.time_calls(lambda: ours(ja, jb), f.calls, int(r == 0)).median)
      tch.append(1e3 * ours_lib.time_calls(theirs, f.calls, int(r == 0)).median)
    x, t = statistics.median(xla), statistics.median(tch)
    gflop = flops(spec, lhs, rhs) / 1e9
    print(f'| {name} | `{spec}` | {x:.2f} | {gflop / x * 1e3:.0f} | {t:.2f} | '
          f'{gflop / t * 1e3:.0f} | {t / x:.2f} |')


if __name__ == '__main__':
  _define_flags()
  app.run(main)
