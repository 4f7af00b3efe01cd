"""Interop tests: need torch (CPU) and timm, installed by `make test-interop`.

`make test` does not collect this directory (--ignore=tests/interop). timm 1.0.31 imports
torchvision at module level; with no CPU torchvision wheel for torch 2.13 here, a stand-in is
installed first (tests/interop/torchvision_stub.py). The measured max relative logit errors are printed in
the terminal summary.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torchvision_stub  # pylint: disable=g-import-not-at-top,wrong-import-position
from parity_figures import FIGURES  # pylint: disable=g-import-not-at-top,wrong-import-position

torchvision_stub.install()


def pytest_terminal_summary(terminalreporter):
  if not FIGURES:
    return
  terminalreporter.write_sep('-', 'max relative logit error, |ours - timm| / max |source logits|')
  for model, direction, error in FIGURES:
    terminalreporter.write_line(f'{model:14s} {direction:40s} {error:.2e}')
