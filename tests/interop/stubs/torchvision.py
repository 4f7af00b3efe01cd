"""`import torchvision` served by the test stand-in (tests/interop/torchvision_stub.py), for a
machine with torch and timm but no torchvision build (no CPU wheel for torch 2.13 here): put this
directory on PYTHONPATH, e.g. `PYTHONPATH=tests/interop/stubs python -m vit_jax bench
--compare=timm ...` (benchmarks/speed_table.py does so when torchvision is absent). Every stand-in
name raises when used, so nothing silently computes without the real torchvision."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     'torchvision_stub.py')
_SPEC = importlib.util.spec_from_file_location('_torchvision_stand_in', _PATH)
_STUB = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_STUB)
_STUB.install(force=True)  # replaces this module in sys.modules with the stand-in package
