"""Huge-page malloc: when the command-line entry points restart with it, and that they do."""

import os
import subprocess
import sys

import pytest

from vit_jax.platform import hostmem
from helpers import ROOT

GLIBC = (2, 36)


@pytest.mark.parametrize('env,mode,libc,expected', [
    ({}, 'madvise', GLIBC, hostmem.TUNABLE),
    ({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'}, 'madvise', GLIBC,
     'glibc.malloc.arena_max=2:' + hostmem.TUNABLE),
    ({'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}, 'madvise', GLIBC, None),  # the user's choice
    ({hostmem.OPT_OUT: '0'}, 'madvise', GLIBC, None),
    ({}, 'always', GLIBC, None),       # the kernel already gives huge pages
    ({}, 'never', GLIBC, None),        # nothing to gain
    ({}, None, GLIBC, None),           # no THP (not Linux)
    ({}, 'madvise', (2, 31), None),    # glibc without the tunable
    ({}, 'madvise', None, None),       # not glibc (musl, macOS)
])
def test_when_to_restart(env, mode, libc, expected):
  assert hostmem.tunables_with_hugepages(env, mode, libc) == expected


def test_thp_mode_reads_the_bracketed_word(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert hostmem.thp_mode(str(path)) == 'madvise'
  assert hostmem.thp_mode(str(tmp_path / 'missing')) is None


def test_entry_point_restarts_itself_once_with_the_tunable():
  code = ('import os; from vit_jax import cli; '
          'cli.run_main(lambda argv: print(os.getpid(), os.environ.get("GLIBC_TUNABLES")))')
  env = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', hostmem.OPT_OUT)}
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err
  pid, tunables = out.split()
  assert int(pid) == proc.pid  # restarted in place (exec), not as a child process
  # The expectation from the machine itself, not from the module under test: the kernel's THP
  # mode is the bracketed word of the sysfs file, and glibc has the tunable from 2.35 on.
  try:
    with open('/sys/kernel/mm/transparent_hugepage/enabled') as f:
      madvise = '[madvise]' in f.read().split()
  except OSError:
    madvise = False
  libc = os.confstr('CS_GNU_LIBC_VERSION') if hasattr(os, 'confstr') else None
  glibc = (libc or '').startswith('glibc ') and tuple(
      int(p) for p in libc.split()[1].split('.')[:2]) >= (2, 35)
  assert tunables == ('glibc.malloc.hugetlb=1' if madvise and glibc else 'None')
