"""The option checks of the k-NN and linear-probe evaluators, without JAX: the registry runs
them as a config or a command line is validated, before anything heavy is imported."""

from typing import Sequence

from vit_jax.errors import UserError

KNN_WEIGHTINGS = ('exp', 'uniform')
PROBE_L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


def check_knn(k: int, temperature: float, weighting: str) -> None:
  """UserError for options no k-NN can use."""
  if int(k) < 1:
    raise UserError(f'k={k} must be at least 1 (e.g. 20, as DINO)')
  if not temperature > 0:
    raise UserError(f'temperature={temperature} must be positive (e.g. 0.07, as DINO)')
  if weighting not in KNN_WEIGHTINGS:
    raise UserError(f'weighting={weighting!r}: use one of {", ".join(KNN_WEIGHTINGS)}')


def check_probe(l2_grid: Sequence[float], holdout: float, steps: int) -> None:
  """UserError for options no probe can use."""
  grid = tuple(l2_grid)
  if not grid or min(grid) < 0:
    raise UserError(f'l2_grid={grid} must be one or more L2 strengths >= 0, e.g. {PROBE_L2_GRID}')
  if not 0 < holdout < 1:
    raise UserError(f'holdout={holdout} must be a fraction between 0 and 1, e.g. 0.2')
  if int(steps) < 1:
    raise UserError(f'steps={steps} must be at least 1 (L-BFGS iterations, e.g. 500)')


__all__ = ['KNN_WEIGHTINGS', 'PROBE_L2_GRID', 'check_knn', 'check_probe']
