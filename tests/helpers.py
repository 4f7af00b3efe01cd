"""Helpers the test modules share (fixtures are in conftest.py): the repository root, a free
loopback port, and a run's metrics log."""

import json
import os
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (for a coordinator or a server)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def records(workdir, split=None) -> list:
  """The records of a run's metrics.jsonl, in order (only those of `split` if given)."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r for r in map(json.loads, f) if split is None or r['split'] == split]


def train_losses(workdir) -> list:
  """The train losses a run logged, in step order."""
  return [r['loss'] for r in records(workdir, 'train')]
