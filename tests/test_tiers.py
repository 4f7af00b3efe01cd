"""The test tiers: a test named in conftest.SYSTEM_TESTS joins the system tier under any id
pytest-xdist gives it (`--dist loadgroup` appends `@group` to the ids of grouped tests)."""

import os
import types

import pytest

import conftest


@pytest.mark.parametrize('suffix', ['', '@reliability'])
def test_a_system_test_is_recognised_with_and_without_its_xdist_group(suffix):
  def item(nodeid):
    return types.SimpleNamespace(nodeid=nodeid, fixturenames=['tmp_path'])
  named = 'tests/test_reliability.py::test_kill_9_loop_always_resumes_and_ends_bitwise_exact'
  assert conftest._is_system(item(named + suffix))  # pylint: disable=protected-access
  generation = 'tests/test_compile_targets.py::test_every_generation_compiles_with_an_estimate'
  assert conftest._is_system(item(f'{generation}[v5e]{suffix}'))  # pylint: disable=protected-access
  assert conftest._is_system(item(f'{generation}[v3]{suffix}'))  # pylint: disable=protected-access
  assert not conftest._is_system(item(f'{generation}x[v3]{suffix}'))  # pylint: disable=protected-access
  assert not conftest._is_system(item(named + 'x' + suffix))  # pylint: disable=protected-access


def test_every_system_test_named_exists():
  """An entry of SYSTEM_TESTS names a test function of its file (a renamed test would otherwise
  fall back into `make test` unseen)."""
  here = os.path.dirname(os.path.abspath(__file__))
  missing = []
  for entry in conftest.SYSTEM_TESTS:
    filename, name = entry.split('::')
    with open(os.path.join(here, filename)) as f:
      if f'def {name.split("[")[0]}(' not in f.read():
        missing.append(entry)
  assert not missing, missing
