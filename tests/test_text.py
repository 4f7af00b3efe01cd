"""The project's text speaks to its users only: no tracked file names the periods the project was
worked in, its tracker's issue numbers, documents outside the repository, or (outside the one
results page and the raw results) the processors its figures were measured on.

Each check is a function from one line to a reason (or None); the tests below feed each one bad
and good lines, then run all of them over every tracked text file.
"""

import os
import re
import subprocess

import pytest

from helpers import ROOT

_ORDINALS = ('first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|'
             'thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|'
             'twentieth|\\d+(?:st|nd|rd|th)')

# The word for a work period ("[s]ession"; the brackets keep this file's own text clean). Its
# other meanings stay: the Session classes of TensorFlow, requests and SQLAlchemy, pytest's scope
# of that name, and a process's or a login's.
_SESSION = re.compile(r'\b[s]essions?\b', re.I)
_SESSION_OK = re.compile(
    r'tf\.(compat\.v1\.)?[S]ession|requests\.[S]ession|sqlalchemy|\b[S]ession\(|'
    r'scope\s*=\s*[\'"][s]ession|request\.[s]ession|\.[s]ession\b|[s]ession[-_ ]?(scope|fixture)|'
    r'\b(ssh|login|process|terminal|tmux|screen|own|new)\s+[s]essions?\b|setsid|'
    r'[s]ession\s+leader|start_new_[s]ession|_[s]ession\b', re.I)
# Numbered periods of work: an ordinal before the word, or "round", "sprint" and the word before
# a number (not "the first round" of a benchmark's alternations).
_NUMBERED_PERIOD = re.compile(
    rf'\b(?:{_ORDINALS})\s+(?:[s]ession|sprint|work\s+period)s?\b'
    r'|\b(?:round|sprint|[s]ession)\s+#?\d+\b', re.I)
# The tracker: the word "issue" (or "PR") before a number, or a hash before one (not a colour,
# an anchor or another project's "owner/repo" reference).
_ISSUE = re.compile(r'\b(?:issues?|pull request|PR)\s*#?\d+\b|(?<![\w/&#-])#\d{1,5}(?![\w-])',
                    re.I)
_OUTSIDE = re.compile(r'\.\./shared\b|\bfacts[ ]sheet\b|vit[_]facts|/wo[r]k/', re.I)
# Brand names as proper nouns (a variable named after one is not text), and lscpu's "family N
# model M" in any case.
_PROCESSOR = re.compile(
    r'\b(?:X[e]on|X[E]ON|E[P]YC|E[p]yc|R[y]zen|T[h]readripper|O[p]teron|G[r]aviton\d*|'
    r'N[e]overse)\b|'
    r'\b(?:Sapphire|Emerald|Granite) Rapids\b|\b(?:Cascade|Ice) Lake\b|\bSkylake\b|'
    r'\bCore\(TM\)|\bCore i[3579]-\d|(?i:\bfamily\s+\d+,?\s+model\s+\d+\b)')
# /proc/cpuinfo text, the input of the tests of code that reads it.
_CPUINFO = re.compile(r'model name(\\t|\t|\s)*:')

# Where processor names belong: the results page and the raw results (with their hardware), and
# the processor parser's test, whose input is /proc/cpuinfo text.
PROCESSOR_PLACES = ('benchmarks/RESULTS.md', 'benchmarks/results/', 'tests/test_processor.py')


def work_period(line: str) -> str | None:
  if _NUMBERED_PERIOD.search(line):
    return 'names a numbered work period'
  for m in _SESSION.finditer(line):
    if not _SESSION_OK.search(line):
      return f'"{m.group(0)}" as a work period'
  return None


def issue_number(line: str) -> str | None:
  m = _ISSUE.search(line)
  return f'cites the tracker ("{m.group(0).strip()}")' if m else None


def outside_document(line: str) -> str | None:
  m = _OUTSIDE.search(line)
  return f'points outside the repository ("{m.group(0)}")' if m else None


def processor_name(line: str) -> str | None:
  m = None if _CPUINFO.search(line) else _PROCESSOR.search(line)
  return f'names a processor ("{m.group(0)}") outside benchmarks/RESULTS.md' if m else None


CHECKS = (work_period, issue_number, outside_document, processor_name)


def problems(path: str, text: str) -> list:
  """'path:line: reason' for every line of `text` that a check refuses."""
  checks = [c for c in CHECKS
            if not (c is processor_name and path.startswith(PROCESSOR_PLACES))]
  found = []
  for number, line in enumerate(text.splitlines(), 1):
    for check in checks:
      reason = check(line)
      if reason:
        found.append(f'{path}:{number}: {reason}: {line.strip()[:120]}')
  return found


def tracked_text_files() -> list:
  """Every tracked file but the lock files and binary files (a NUL byte in the first 8 KiB)."""
  names = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode().split('\0')
  files = []
  for name in filter(None, names):
    full = os.path.join(ROOT, name)
    if name.endswith('.lock') or not os.path.isfile(full):
      continue
    with open(full, 'rb') as f:
      head = f.read(8192)
    if b'\0' not in head:
      files.append(name)
  return files


@pytest.mark.parametrize('check, line', [
    (work_period, 'Measured in the eleventh sess' 'ion on the same machine.'),
    (work_period, 'the previous sess' 'ion changed only tests'),
    (work_period, "(the sess" "ion's CPU budget)"),
    (work_period, 'Sess' 'ions 3 and 4 tuned the allocator.'),
    (work_period, 'as planned in rou' 'nd 3'),
    (work_period, 'the thirteenth spr' 'int of review'),
    (issue_number, "`make train`'s recipe until iss" "ue 18"),
    (issue_number, 'Config files that cannot be loaded (iss' 'ue #' '19).'),
    (issue_number, 'see #' '45 for the plan'),
    (issue_number, 'fixed in P' 'R 12'),
    (outside_document, 'the facts s' 'heet (section 1) quotes it'),
    (outside_document, 'see ../sha' 'red/design.md'),
    (outside_document, 'from /wo' 'rk/shared/facts/vit_' 'facts.md'),
    (processor_name, 'On an Intel Xe' 'on the step is slower'),
    (processor_name, '(AMD EP' 'YC fam' 'ily 26 model 2, 2 cores)'),
    (processor_name, 'measured on fam' 'ily 6, model 207'),
    (processor_name, 'a Sapphire Ra' 'pids host'),
])
def test_each_check_refuses_a_bad_line(check, line):
  assert check(line)


@pytest.mark.parametrize('check, line', [
    (work_period, 'sess = tf.Sess' 'ion()'),
    (work_period, "@pytest.fixture(scope='sess" "ion')"),
    (work_period, 'selected = request.sess' 'ion.items'),
    (work_period, 'a dropped ssh sess' 'ion does not stop it'),
    (work_period, 'each trainer in its own sess' 'ion (setsid)'),
    (work_period, 's = requests.Sess' 'ion()'),
    (work_period, 'the third column holds the seed'),
    (work_period, 'for r in range(rounds):  # the first round warms both sides up'),
    (issue_number, 'The launcher will issue a warning and 2 retries.'),
    (issue_number, "colour='#123456' and c='#1f77b4'"),
    (issue_number, 'jax-ml/jax#35905 tracks the port change'),
    (issue_number, 'see the README, section 2 (#quickstart)'),
    (outside_document, 'see docs/data.md and ../README.md'),
    (processor_name, 'the processor family and model come from lscpu'),
    (processor_name, 'a 2-core CPU and a GPU'),
    (processor_name, "assert key(epyc) != key(xeon)"),
    (processor_name, "info = 'model name\\t: Intel(R) Xe' 'on(R) Processor'"),
])
def test_each_check_passes_a_good_line(check, line):
  assert check(line) is None


def test_processor_names_are_allowed_on_the_results_page_only():
  line = '| AMD EP' 'YC, fam' 'ily 26 model 2 | 30.5 |\n'
  assert problems('benchmarks/RESULTS.md', line) == []
  assert problems('benchmarks/results/speed.jsonl', line) == []
  assert len(problems('docs/speed.md', line)) == 1
  assert len(problems('README.md', 'iss' 'ue 18, on an AMD EP' 'YC\n')) == 2


def test_tracked_text_files_exist():
  files = tracked_text_files()
  assert 'README.md' in files and 'tests/conftest.py' in files
  assert not any(f.endswith('.lock') or f.endswith('.png') for f in files)


def test_no_tracked_file_speaks_of_how_the_project_was_built():
  found = []
  for name in tracked_text_files():
    with open(os.path.join(ROOT, name), encoding='utf-8', errors='replace') as f:
      found += problems(name, f.read())
  assert not found, f'{len(found)} line(s):\n' + '\n'.join(found)


# Private shorthand for the papers and the code the project follows: "P Table 3" is "ViT paper,
# Table 3"; "AR" the AugReg paper; "VJ" the original vision_transformer code; "BV" big_vision.
# The docs, README.md and vit_jax/ spell them out.
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
