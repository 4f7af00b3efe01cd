"""The two parallel paths around one pure step: 'jit' and 'pmap'.

  jit    `jax.jit` of the global-batch step with explicit in/out shardings from the policy in
         `sharding.py` (data parallel, FSDP, tensor parallel or a mix, by the mesh shape), the
         activation constraints of the model switched on, the state donated.
  pmap   classic replicated data parallelism: a per-device program that sees its own rows of the
         batch and averages gradients with `pmean` over the devices (`step.make_train_step` with
         `reduce_axis=PMAP_AXES`). It is written with `jax.shard_map`, which is what `jax.pmap`
         runs on since JAX 0.8 (jax.pmap is in maintenance mode and its replication helpers are
         gone in 0.10); the state stays one replicated array per leaf, so checkpoints are the
         same on both paths and restore on either.

Evaluation is the same jitted function on both paths (a sum over the batch, no optimizer).
"""

import jax
from jax.sharding import PartitionSpec as P

from vit_jax.errors import UserError
from vit_jax.parallel import sharding
from vit_jax.parallel.choices import PARALLELISMS
PMAP_AXES = sharding.BATCH_AXES  # the per-device program reduces over every batch axis


def reduce_axis(parallelism: str):
  """The collective axis the train step reduces over: None under jit, the batch axes for pmap."""
  return PMAP_AXES if parallelism == 'pmap' else None


def check_parallelism(parallelism: str, mesh) -> None:
  if parallelism not in PARALLELISMS:
    raise UserError(f'unknown parallelism {parallelism!r}: use config.parallelism=jit or pmap')
  if parallelism == 'pmap' and (mesh.shape['fsdp'] > 1 or mesh.shape['model'] > 1):
    raise UserError(f'parallelism=pmap is data parallel only but the mesh has fsdp='
                    f'{mesh.shape["fsdp"]}, model={mesh.shape["model"]}: use '
                    f'config.parallelism=jit for FSDP or tensor parallelism, or set '
                    f'config.mesh.fsdp=1 config.mesh.model=1')


def compile_train_step(train_step, parallelism: str, mesh, state_shardings):
  """The jitted `train_step(state, batch, rng, hyper) -> (state, metrics)` for this path and
  mesh (`hyper`: replicated scalars, vit_jax/train/step.py)."""
  check_parallelism(parallelism, mesh)
  if parallelism == 'jit':
    fn = sharding.with_activation_sharding(train_step, mesh)
  else:
    # check_vma=False gives pmap's semantics: gradients of the replicated parameters stay
    # per-device until the step's explicit pmean (with check_vma=True, differentiating a
    # replicated input already psums the gradient, so the pmean would see a sum).
    fn = jax.shard_map(train_step, mesh=mesh, in_specs=(P(), P(PMAP_AXES), P(), P()),
                       out_specs=(P(), P()), check_vma=False)
  repl = sharding.replicated(mesh)
  return jax.jit(fn, in_shardings=(state_shardings, sharding.batch_sharding(mesh), repl, repl),
                 out_shardings=(state_shardings, repl), donate_argnums=(0,))


def compile_eval_step(eval_step, mesh, param_shardings):
  """The jitted `eval_step(params, batch) -> sums`, with activation constraints."""
  return jax.jit(sharding.with_activation_sharding(eval_step, mesh),
                 in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
                 out_shardings=sharding.replicated(mesh))


__all__ = ['PARALLELISMS', 'PMAP_AXES', 'reduce_axis', 'check_parallelism',
           'compile_train_step', 'compile_eval_step']
