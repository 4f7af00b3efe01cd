"""What a compiled train step needs on each device, without running it (`config.compile_only`).

XLA's memory analysis of the compiled per-device program gives argument bytes (train state shard
+ batch shard + rng), output bytes, bytes aliased between them (the donated state) and temporary
bytes (activations kept for the backward pass, gradients, workspace). Peak is taken as
arguments + outputs - aliased + temporaries. The state bytes per device are also computed from
the shardings directly (parameters and optimizer state separately), as a cross-check.
"""

from typing import Any, Dict

import jax

from vit_jax.parallel import sharding as sharding_lib

GIB = 2 ** 30


def compiled_step_report(jitted_step, abstract_state, state_shardings, abstract_batch,
                         rng) -> Dict[str, Any]:
  """Lowers and compiles `jitted_step(state, batch, rng)` on abstract inputs; returns bytes/FLOPs."""
  state_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract_state, state_shardings)
  compiled = jitted_step.lower(state_in, abstract_batch, rng).compile()
  stats = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per program
    cost = cost[0] if cost else {}
  args, out = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
  alias, temp = int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes)
  params_sh = state_shardings.params
  opt_sh = state_shardings.opt_state
  return {
      'devices': int(jax.tree.leaves(state_shardings)[0].mesh.devices.size),
      'param_bytes': sharding_lib.state_bytes_per_device(abstract_state.params, params_sh),
      'opt_state_bytes': sharding_lib.state_bytes_per_device(abstract_state.opt_state, opt_sh),
      'argument_bytes': args,
      'output_bytes': out,
      'alias_bytes': alias,
      'temp_bytes': temp,
      'peak_bytes': args + out - alias + temp,
      'flops': float(cost.get('flops', 0.0)),
  }


def format_report(report: Dict[str, Any], what: str) -> str:
  """A few readable lines (GiB per device)."""
  g = lambda key: report[key] / GIB
  return '\n'.join([
      f'compile-only: {what}',
      f'  per device: parameters {g("param_bytes"):.3f} GiB + optimizer state '
      f'{g("opt_state_bytes"):.3f} GiB',
      f'  compiled train step, per device: arguments {g("argument_bytes"):.3f} GiB, outputs '
      f'{g("output_bytes"):.3f} GiB (of which {g("alias_bytes"):.3f} GiB reuse the donated '
      f'state), temporaries {g("temp_bytes"):.3f} GiB',
      f'  peak per device (arguments + outputs - aliased + temporaries): '
      f'{g("peak_bytes"):.3f} GiB; {report["flops"] / 1e12:.3f} TFLOP per step per device',
  ])


__all__ = ['compiled_step_report', 'format_report']
