"""The initial train state made in small programs (`program.Init.on_host`, models/inits.py) is the
one program's, bitwise, for every model family and init option, in the same shardings."""

import jax
import numpy as np
import pytest

from configs import common, mnist5k
from vit_jax.train import program


def _config(model_name, **overrides):
  c = mnist5k.get_config(f'model_name={model_name},steps=3')
  c.warmup_steps = 1
  common.apply(c, overrides)
  return c


@pytest.mark.parametrize('model_name, overrides', [
    ('ViT-Ze/4', {'polyak_decay': 0.9, 'mesh.data': 1, 'mesh.fsdp': -1}),  # 8 devices, FSDP
    ('ViT-Ze/4', {'model.representation_size': 16, 'model.scan': True}),   # pre_logits; stacked
    ('ViT-Ze/4', {'loss': 'mpp'}),                                          # the mask token
    ('R+ViT-Ze/4', {}),
    ('BiT-R14x0.5', {'model.head_bias_init': -1.0}),
], ids=['fsdp-polyak', 'repr-scan', 'mpp', 'hybrid', 'bit'])
def test_state_made_in_small_programs_equals_the_one_program(model_name, overrides):
  # Both routes compiled now, under this test's settings: jit keeps an initialiser's program in
  # memory whatever settings it was compiled with, and another test of this process may have
  # compiled it with XLA's optimisations on (helpers.optimized), which moves a value by an ulp.
  jax.clear_caches()
  prog = program.build_program(_config(model_name, **overrides))
  one = jax.jit(prog.init_fn, out_shardings=prog.state_shardings)(prog.init_rng)
  small = prog.init_fn.on_host(prog.init_rng, prog.state_shardings)
  assert jax.tree.structure(one) == jax.tree.structure(small)
  flat_one = jax.tree_util.tree_leaves_with_path(one)
  for (path, a), b in zip(flat_one, jax.tree.leaves(small)):
    where = jax.tree_util.keystr(path)
    assert a.dtype == b.dtype and a.sharding == b.sharding, where
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
  params = np.concatenate([np.ravel(p) for p in jax.tree.leaves(one.params)])
  assert np.std(params) > 1e-3  # random initialisers ran (not a tree of zeros)


@pytest.mark.parametrize('model_name, small', [
    ('ViT-Mu/4', True), ('ViT-Ze/4', False), ('R+ViT-Ze/4', False), ('BiT-R14x0.5', False)])
def test_a_cpu_run_makes_its_state_in_small_programs_when_its_arrays_share_shapes(
    monkeypatch, model_name, small):
  """ViT-Mu/4: 104 parameter arrays of 12 shapes (8.7 per shape) -> small programs; ViT-Ze/4: 40
  of 12, R+ViT-Ze/4: 43 of 13, BiT-R14x0.5: 45 of 24 -> one program (program.in_small_programs)."""
  prog = program.build_program(_config(model_name))
  calls = []
  on_host = program.Init.on_host
  monkeypatch.setattr(program.Init, 'on_host',
                      lambda self, *args: calls.append(args) or on_host(self, *args))
  state = prog.init_state()
  assert len(calls) == int(small)
  if small:
    assert calls[0][1] is prog.state_shardings
  assert jax.tree.structure(state) == jax.tree.structure(prog.abstract_state)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(prog.state_shardings)):
    assert a.sharding == b


def test_the_small_programs_rule_counts_arrays_per_shape():
  def f32(*shape):
    return jax.ShapeDtypeStruct(shape, np.float32)

  assert program.in_small_programs([f32(4, 4)] * 8)
  assert not program.in_small_programs([f32(4, 4)] * 7)
  assert not program.in_small_programs([f32(4, 4)] * 8 + [f32(3)])  # 9 arrays of 2 shapes
  assert program.in_small_programs([f32(4, 4)] * 12 + [f32(3)] * 4)  # 16 of 2
  assert not program.in_small_programs([f32(4)] * 4 + [jax.ShapeDtypeStruct((4,), np.int32)] * 4)


def test_each_process_of_a_cpu_run_makes_the_state_in_small_programs(monkeypatch):
  """With several processes, each makes the whole parameters and keeps its shards (here one
  process poses as one of two; the real two-process run: tests/test_multiprocess.py)."""
  prog = program.build_program(_config('ViT-Mu/4', **{'mesh.data': 2, 'mesh.fsdp': 4}))
  one = jax.jit(prog.init_fn, out_shardings=prog.state_shardings)(prog.init_rng)
  calls = []
  on_host = program.Init.on_host
  monkeypatch.setattr(program.Init, 'on_host',
                      lambda self, *args: calls.append(args) or on_host(self, *args))
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  state = prog.init_state()
  assert len(calls) == 1
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(state)):
    assert a.sharding == b.sharding
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
