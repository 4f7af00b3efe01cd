"""The reference tables of the docs against the code's own tables: a row that differs fails.

docs/models.md (variants, options and their defaults, values and families, remat policies,
attention kernels, what `auto` picks per platform), configs/README.md (every config key and its
default) and docs/training.md (the keys `make train`'s recipe sets); the jax versions docs/gpu.md
and the GPU rows of benchmarks/RESULTS.md name, against the locks and the raw results. Each
Markdown table is parsed into rows and compared with what the code holds; the first test shows a
wrong row failing.
"""

import ast
import dataclasses
import json
import os
import re
import sys
from typing import Dict, List, Sequence, Tuple

import jax.numpy as jnp

from vit_jax.configs import common
from vit_jax.models import attention, option_values, options, variants
from helpers import ROOT

sys.path.insert(0, ROOT)
from configs import default  # pylint: disable=g-import-not-at-top,wrong-import-position


Table = Tuple[Tuple[str, ...], List[Tuple[str, ...]]]  # (header, rows)


def _cells(line: str) -> Tuple[str, ...]:
  """A table row's cells; `\\|` is a pipe inside a cell (GitHub's table syntax)."""
  cells = re.split(r'(?<!\\)\|', line.strip().strip('|'))
  return tuple(c.strip().replace('\\|', '|') for c in cells)


def markdown_tables(text: str) -> List[Table]:
  """Every pipe table of a Markdown text: its header cells and its rows' cells."""
  tables, lines = [], text.splitlines()
  i = 0
  while i < len(lines):
    is_rule = i + 1 < len(lines) and re.fullmatch(r'\s*\|(\s*:?-+:?\s*\|)+\s*', lines[i + 1])
    if lines[i].lstrip().startswith('|') and is_rule:
      header, rows, i = _cells(lines[i]), [], i + 2
      while i < len(lines) and lines[i].lstrip().startswith('|'):
        rows.append(_cells(lines[i]))
        i += 1
      tables.append((header, rows))
    else:
      i += 1
  return tables


def table(text: str, header: Sequence[str]) -> List[Tuple[str, ...]]:
  """The rows of the one table of `text` with this header."""
  found = [rows for head, rows in markdown_tables(text) if head == tuple(header)]
  assert len(found) == 1, f'{len(found)} tables with the header {header}'
  return found[0]


def code(cell: str) -> str:
  """A cell's text without the backticks around it."""
  return cell.strip().strip('`')


def mismatches(documented: Dict[str, object], actual: Dict[str, object]) -> List[str]:
  """How a documented table (first column -> the rest) differs from the code's: rows missing,
  rows the code does not have, rows that say something else, rows out of order."""
  out = [f'missing row {k!r}: the code has {v!r}' for k, v in actual.items()
         if k not in documented]
  out += [f'row {k!r} is not in the code' for k in documented if k not in actual]
  out += [f'row {k!r} says {documented[k]!r}, the code {actual[k]!r}' for k in documented
          if k in actual and documented[k] != actual[k]]
  if not out and list(documented) != list(actual):
    out.append(f'rows in the order {list(documented)}, the code {list(actual)}')
  return out


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


def _numbers(cell: str) -> Tuple[int, ...]:
  return tuple(int(n) for n in re.findall(r'\d+', cell))


def test_a_table_that_differs_from_the_code_fails():
  """The comparison itself: a deliberately wrong row, a missing one, an extra one and a swapped
  order are each reported; the right table is not."""
  text = ('| base | layers |\n|---|---|\n| `Ti` | 12 |\n| `S` | 12 |\n\n'
          'Other text.\n\n| x | y |\n|---|---|\n| 1 | 2 |\n')
  assert markdown_tables(text) == [(('base', 'layers'), [('`Ti`', '12'), ('`S`', '12')]),
                                   (('x', 'y'), [('1', '2')])]
  actual = {'Ti': 12, 'S': 12}
  doc = {code(r[0]): int(r[1]) for r in table(text, ('base', 'layers'))}
  assert mismatches(doc, actual) == []
  wrong = text.replace('| `S` | 12 |', '| `S` | 24 |')
  doc = {code(r[0]): int(r[1]) for r in table(wrong, ('base', 'layers'))}
  assert mismatches(doc, actual) == ["row 'S' says 24, the code 12"]
  assert mismatches({'Ti': 12}, actual) == ["missing row 'S': the code has 12"]
  assert mismatches({**actual, 'Q': 1}, actual) == ["row 'Q' is not in the code"]
  assert mismatches({'S': 12, 'Ti': 12}, actual) == [
      "rows in the order ['S', 'Ti'], the code ['Ti', 'S']"]
  # And through a real page: docs/models.md with one base's depth changed.
  page = _read('docs/models.md').replace('| `L` | 24 | 1024 |', '| `L` | 12 | 1024 |')
  assert mismatches(_bases(page), _code_bases()) == [
      "row 'L' says (12, 1024, 4096, 16), the code (24, 1024, 4096, 16)"]


# docs/models.md


def _bases(text: str) -> Dict[str, tuple]:
  rows = table(text, ('base', 'layers', 'width', 'MLP', 'heads'))
  return {code(r[0]): tuple(int(c) for c in r[1:]) for r in rows}


def _code_bases() -> Dict[str, tuple]:
  return {name: (b['num_layers'], b['hidden_size'], b['mlp_dim'], b['num_heads'])
          for name, b in variants.BASES.items()}


def test_models_md_variant_tables_are_the_variant_table():
  text = _read('docs/models.md')
  assert mismatches(_bases(text), _code_bases()) == []
  hybrids = {code(r[0]): (r[1], _numbers(r[2]), int(r[3]))
             for r in table(text, ('name', 'base', 'ResNet units per stage',
                                   'patch on the feature map'))}
  assert mismatches(hybrids, {name: (base, tuple(units), patch)
                              for name, (base, units, patch) in variants.HYBRIDS.items()}) == []
  bits = {int(r[0]): _numbers(r[1]) for r in table(text, ('depth', 'units per stage'))}
  assert mismatches(bits, {d: tuple(u) for d, u in variants.BIT_DEPTHS.items()}) == []


def _default_text(default_value) -> str:
  """An option's default as the options table writes it."""
  if default_value is dataclasses.MISSING:
    return 'variant'
  if isinstance(default_value, type):  # a dtype class
    return jnp.dtype(default_value).name
  return repr(default_value)


def test_models_md_options_table_is_the_option_policy():
  """Every option in declaration order, its default, the families that take it, and for the
  options with a fixed set or range of values exactly those."""
  rows = table(_read('docs/models.md'), ('option', 'default', 'values', 'models', 'meaning'))
  families = {'ViT': 'VisionTransformer', 'BiT': 'BiT', 'Mixer': 'MlpMixer'}
  doc = {code(r[0]): (code(r[1]), tuple(families[f.strip()] for f in r[3].split(',')))
         for r in rows}
  takes = lambda name: tuple(c.__name__ for c in options.FAMILIES
                             if name in {f.name for f in dataclasses.fields(c)})
  actual = {name: (_default_text(value), takes(name)) for name, value in options.DEFAULTS.items()}
  assert mismatches(doc, actual) == []
  values = {code(r[0]): r[2] for r in rows}
  for name, choices in option_values.CHOICES.items():
    assert tuple(v.strip() for v in values[name].split('/')) == choices, name
  for name, (_, what) in option_values.RANGES.items():
    assert values[name] == what, name
  for name in option_values.DTYPES:
    assert values[name].startswith('a dtype'), name


def test_models_md_remat_and_attention_tables_are_the_code_tables():
  text = _read('docs/models.md')
  remat = [code(r[0]) for r in table(text, ('remat', 'what the backward pass keeps of each '
                                                      'encoder block'))]
  assert remat == list(option_values.REMAT_POLICIES)
  kernels = [code(r[0]) for r in table(text, ('kernel', 'runs on', 'what it is'))]
  assert kernels == list(attention.ATTENTIONS)
  auto = {r[0].lower(): code(r[1]) for r in table(text, ('platform', 'auto'))}
  assert mismatches(auto, dict(attention.AUTO)) == []


# configs/README.md and docs/training.md


def _value(cell: str):
  """A documented config value: a Python literal, or `None (int)` for an unset typed key."""
  text = code(cell)
  unset = re.fullmatch(r'None \((\w+)\)', text)
  return ('unset', unset.group(1)) if unset else ast.literal_eval(text)


def _config_value(config, key: str):
  value = common.get_value(config, key)
  if value is None:
    parent, _, leaf = key.rpartition('.')
    node = common.get_value(config, parent) if parent else config
    return ('unset', node.get_type(leaf).__name__)
  return value


def _typed(values: Dict[str, object]) -> Dict[str, tuple]:
  """Values with their types: 1 and 1.0 (or True) are different defaults."""
  return {k: (type(v).__name__, v) for k, v in values.items()}


def test_configs_readme_lists_every_key_with_its_default():
  config = common.base_config()
  doc = {}
  for header, rows in markdown_tables(_read('configs/README.md')):
    if header == ('key', 'default', 'meaning'):
      doc.update({code(r[0]): _value(r[1]) for r in rows})
  keys = _flat_keys(config)
  assert sorted(doc) == sorted(keys)  # the order is the page's, by topic
  assert mismatches(_typed(doc), _typed({k: _config_value(config, k) for k in doc})) == []


def _flat_keys(config, prefix: str = '') -> List[str]:
  out = []
  for key, value in config.items():
    out += _flat_keys(value, f'{prefix}{key}.') if hasattr(value, 'items') else [prefix + key]
  return out


def test_training_md_recipe_table_is_make_trains_config():
  rows = table(_read('docs/training.md'), ('key', 'value', 'meaning'))
  doc = {code(r[0]): _value(r[1]) for r in rows}
  config, base = default.get_config(), common.base_config()
  assert mismatches(_typed(doc), _typed({k: _config_value(config, k) for k in doc})) == []
  # Every key the recipe sets away from the schema's default is in the table.
  changed = [k for k in _flat_keys(config)
             if common.get_value(config, k) != common.get_value(base, k)]
  assert not set(changed) - set(doc), sorted(set(changed) - set(doc))


# The jax versions the GPU pages name.


def _pinned(lock: str, package: str) -> str:
  return re.search(rf'^{re.escape(package)}==(\S+)', _read(lock), re.M).group(1)


def test_gpu_pages_name_the_jax_each_figure_was_measured_with():
  """docs/gpu.md names the jax that `make install ACCEL=cuda13` installs (the locks' pin); each
  row of the GPU table on RESULTS.md names the jax its raw record (results/gpu.jsonl) was
  measured with."""
  jax_pin = _pinned('requirements.lock', 'jax')
  assert jax_pin == _pinned('requirements-cuda13.lock', 'jax-cuda13-plugin')
  assert f'installs the pinned jax {jax_pin} (`requirements.lock`)' in _read('docs/gpu.md')
  records = [json.loads(line) for line in _read('benchmarks/results/gpu.jsonl').splitlines()]
  rows = table(_read('benchmarks/RESULTS.md'), ('run', 'img/s', 'MFU', 'peak GB',
                                                'first result s', 'jax', 'vs timm compiled'))
  assert rows
  for row in rows:
    img_per_s = int(row[1].replace(',', ''))
    record, = [r for r in records if round(r.get('img_per_s') or 0) == img_per_s]
    measured = re.search(r'\bjax (\S+)', record['software']).group(1)
    assert row[5] == measured, (row[0], row[5], measured)
