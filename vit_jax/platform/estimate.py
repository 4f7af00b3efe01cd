"""How long a step compiled for a TPU slice takes, by the TPU compiler's own cost model.

`compiled.cost_analysis()` of a program compiled for a TPU carries `optimal_seconds`: the cost
model's lower bound for one run of the per-device program (a roofline per fused op: the larger of
its FLOPs at the chip's peak and its bytes at the chip's HBM bandwidth, summed over the ops, with
no overlap of communication). A real step takes at least that long. From it and the step's batch
this module derives images per second per chip, the utilisation of the chip's peak (the one chip
table, vit_jax/platform/chips.py) and the wall time of a run of known length.

The cost model does not cost custom calls: a Pallas kernel (the splash attention of
`model.attention=flash`) counts as zero FLOPs and zero seconds. Where a program holds such calls
their matmul FLOPs are counted from the model's shapes (`uncosted_flops`, computed by the caller)
and added at the chip's peak, so the figure stays a lower bound and is never silently short.

The cost model also gives -1 s, a "not costed" value, to each `ConcatBitcast` custom call that the
TPU compiler's own layout passes insert (on v4, v5e and v6e, where parameter slices are joined in
place); summed into `optimal_seconds` they make it negative. Such a call moves no data, so each
one's -1 s is taken back out (`concat_bitcasts`) and it costs zero.
"""

import re
from typing import Any, Dict, Optional

from vit_jax.platform import chips

# A Pallas kernel compiled for a TPU appears in the optimized HLO as this custom call.
_TPU_CUSTOM_CALL = re.compile(r'custom_call_target="tpu_custom_call"')
# The TPU compiler's in-place concatenation, which its cost model gives `_NOT_COSTED` seconds.
_CONCAT_BITCAST = re.compile(r'custom_call_target="ConcatBitcast"')
_NOT_COSTED = -1.0


def _count(compiled, pattern: re.Pattern) -> int:
  try:
    text = compiled.as_text()
  except Exception:  # pylint: disable=broad-except  # a backend without HLO text: none seen
    return 0
  return len(pattern.findall(text or ''))


def custom_calls(compiled) -> int:
  """The Pallas (TPU custom) calls in a compiled program, which the cost model does not cost."""
  return _count(compiled, _TPU_CUSTOM_CALL)


def concat_bitcasts(compiled) -> int:
  """The ConcatBitcast calls in a compiled program, each -1 s in the cost model's total."""
  return _count(compiled, _CONCAT_BITCAST)


def step(cost: Dict[str, Any], batch_per_device: float, chip: chips.Chip,
         uncosted_flops: float = 0.0) -> Optional[Dict[str, float]]:
  """The estimate of one compiled step from its `cost` (`memory.step_stats`: `flops`,
  `optimal_seconds`, `custom_calls`, `concat_bitcasts`), or None where the compiler gave no
  estimate.

  `uncosted_flops`: the per-device FLOPs of the step's custom calls, counted from the model's
  shapes; they are added to the FLOPs and, at the chip's peak, to the seconds.
  Returns seconds, FLOPs per device, images per second per chip, and utilisation (the FLOPs
  rate over the peak of the device's chip share, a fraction).
  """
  seconds = cost.get('optimal_seconds')
  if seconds is None:
    return None
  seconds -= cost.get('concat_bitcasts', 0) * _NOT_COSTED
  if seconds <= 0:  # still not positive: ops the cost model could not cost, of another kind
    return None
  peak = chip.bf16_flops  # per JAX device
  extra = uncosted_flops if cost.get('custom_calls') else 0.0
  seconds = seconds + extra / peak
  flops = cost['flops'] + extra
  devices_per_chip = chip.slices.devices_per_chip if chip.slices else 1
  return {
      'seconds': seconds,
      'flops': flops,
      'uncosted_flops': extra,
      'images_per_second_per_chip': batch_per_device * devices_per_chip / seconds,
      'utilisation': flops / seconds / peak,
  }


def duration(seconds: float) -> str:
  """'142 ms', '3.4 s', '12.5 min', '6.1 h', '3.2 days'."""
  if seconds < 1:
    return f'{seconds * 1e3:.3g} ms'
  for unit, size in (('days', 86400), ('h', 3600), ('min', 60)):
    if seconds >= size * (2 if unit == 'days' else 1):
      return f'{seconds / size:.3g} {unit}'
  return f'{seconds:.3g} s'


def flop_count(flops: float) -> str:
  """'6.79 TFLOP', '300 GFLOP', '21.3 MFLOP'."""
  for unit, size in (('TFLOP', 1e12), ('GFLOP', 1e9)):
    if flops >= size:
      return f'{flops / size:.3g} {unit}'
  return f'{flops / 1e6:.3g} MFLOP'


def describe(estimate: Dict[str, float], what: str) -> str:
  """'train step 142 ms (449 images/s per chip, 77% of peak)'."""
  return (f'{what} {duration(estimate["seconds"])} '
          f'({estimate["images_per_second_per_chip"]:,.0f} images/s per chip, '
          f'{estimate["utilisation"]:.0%} of peak)')


__all__ = ['custom_calls', 'concat_bitcasts', 'step', 'duration', 'flop_count', 'describe']
