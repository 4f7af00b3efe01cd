"""The project's text spells its references out: no private shorthand for the papers and the code
it follows ("P Table 3" is "ViT paper, Table 3"; "AR" the AugReg paper; "VJ" the original
vision_transformer code; "BV" big_vision) in docs/, README.md and vit_jax/."""

import os
import re

from helpers import ROOT

SHORTHAND = re.compile(r'\bP (Table|Tables|Tab\.|App\.|Appendix|§|Fig\.|Figure|Section)'
                       r'|\b(AR|VJ|BV)\b')


def _text_files():
  yield 'README.md'
  for top in ('docs', 'vit_jax'):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
      for name in sorted(names):
        if name.endswith(('.py', '.md')):
          yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def shorthand(text: str) -> list:
  return [m.group(0) for m in SHORTHAND.finditer(text)]


def test_the_check_sees_each_kind_of_shorthand():
  assert shorthand('(P Table 3; P Tab.2, P §4.1) AR Tab.3, VJ: bf16; BV: full[51200:]') == [
      'P Table', 'P Tab.', 'P §', 'AR', 'VJ', 'BV']
  assert shorthand('ViT paper, Table 3; PartitionSpec as P; RandAugment; the AugReg paper') == []


def test_docs_readme_and_the_library_spell_their_references_out():
  found = {}
  for path in _text_files():
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
      hits = shorthand(f.read())
    if hits:
      found[path] = hits
  assert not found, found
