"""Every command shown in README.md and docs/*.md runs as written.

A command is a line of a fenced code block that starts (after `VAR=value` assignments) with
`python`, `python3`, `.venv/bin/python`, `make` or `vit-jax`; a line ending in `\\` goes on with
the next; `#` starts a comment; a line that only assigns a variable (`W=runs/x`) is kept for the
commands after it in the same block. Each command runs in bash from the repository root, with
`.venv/bin` first on PATH, this checkout on PYTHONPATH, and every `runs/` path moved into a
temporary directory, where `runs/default` holds a tiny trained run (what `make train` leaves). It
must exit 0, or stop at its intended one-line error: exit status 2 and a last line of stderr that
starts with `error:` and matches the pattern registered for it.

To keep the whole file within about 90 CPU-seconds, COMMANDS may append flags to a command
(fewer steps, a smaller model; absl takes the last value of a repeated flag) or replace a part of
it. A command without an entry in COMMANDS fails `test_every_command_is_registered`: register
it there, keyed by a prefix of the command as the docs show it (whitespace collapsed).
"""

import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT

pytestmark = pytest.mark.xdist_group('docs_commands')

DOCS = ('README.md', 'docs')
_STARTS = re.compile(r'^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*'
                     r'(?:python3?|\.venv/bin/python|make|vit-jax)(?:\s|$)')
_ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=\S*$')


@dataclasses.dataclass(frozen=True)
class Run:
  """Runs and exits 0; `append` goes at the end, `replace` maps parts of the command."""
  append: str = ''
  replace: tuple = ()


@dataclasses.dataclass(frozen=True)
class Fails:
  """Stops at its intended `error:` line (exit status 2), which matches `error`."""
  error: str
  append: str = ''
  replace: tuple = ()


@dataclasses.dataclass(frozen=True)
class Exempt:
  """Not run here, for the reason given."""
  reason: str


_FAST_TRAIN = ('--config.total_steps=2 --config.warmup_steps=1 --config.eval_every=2 '
               '--config.progress=False')
_FAST_ZE = _FAST_TRAIN + ' --config.model_name=ViT-Ze/4'  # the 2-layer model for the default one
_SMALL_TPU_PLAN = ('--config.compile_for=v3-8 --config.model_name=ViT-Ze/4 --config.image_size=28 '
                   '--config.batch_size=8')
_NOT_PREPARED = r"^error: dataset '[\w/]+' is not prepared: tfds looked in "
_NO_DATA = rf"{_NOT_PREPARED}|^error: no ImageNet-21k release under "
_ELIDED = r'^error: missing --workdir'  # a line that ends in `...` (arguments left out)
_PY = '.venv/bin/python -m vit_jax'
_ZE = (('model=Mu/4', 'model=Ze/4'),)  # the recipe chain with the 2-layer model too

# The one table: a prefix of the command as the docs show it -> what it must do here. The longest
# matching prefix wins.
COMMANDS = {
    # The quickstart: what CI runs (.ci/run), not run again here.
    'make train': Exempt('the quickstart itself; `make test` and CI run the trainer end to end'),
    'make test': Exempt('the test suite itself (this file is part of it)'),
    'make install': Exempt('installs packages from PyPI'),
    'make tpu-compiler': Exempt('installs packages from PyPI'),
    'make gpu-compiler': Exempt('installs packages from PyPI'),
    # README.md
    f'{_PY}.main --config=configs/default.py --workdir=runs/cifar10': Fails(_NOT_PREPARED),
    f'{_PY}.main --config=configs/finetune.py:model=B/16,dataset=cifar10': Fails(_NOT_PREPARED),
    f'{_PY}.main --config=configs/default.py --workdir=runs/pets':
        Fails(r'^error: folder:/data/pets: /data/pets does not exist'),
    f'{_PY}.main --config=configs/plans.py:recipe=headline,model=H/14': Run(_SMALL_TPU_PLAN),
    f'{_PY}.main --config=configs/default.py --workdir=/tmp/plan --config.compile_for=v5litepod-16':
        Fails(r'^error: eval_batch_size=200 does not split over 16 devices in 1 processes: use '
              r'a multiple of 16, e\.g\. --config\.eval_batch_size=192 or 208$'),
    f'{_PY} predict --workdir=runs/default': Run(),
    f'{_PY} weights': Run(),
    f'{_PY} sweep --sweep=experiments/posemb/sweep.py --workdir=runs/posemb --dry_run': Run(),
    # docs/training.md
    f'{_PY}.main --config=configs/default.py --workdir=runs/mine': Run(_FAST_ZE),
    # docs/models.md
    '.venv/bin/python -c "from vit_jax.models import create_model, cost;': Run(),
    'W=runs/flexi; python -m vit_jax.main --config=configs/default.py --workdir=$W': Run(_FAST_TRAIN),
    'W=runs/flexi; python -m vit_jax evaluate --workdir=$W --evals=eval --patch_size=4': Run(),
    'W=runs/flexi; python -m vit_jax predict --workdir=$W --patch_size=14 digit.png': Run(),
    # docs/interop.md
    f'{_PY} export --workdir=runs/default': Run(),
    f'{_PY} convert --workdir=runs/default': Run(),
    # docs/speed.md
    f'{_PY} bench --model=ViT-Ti/16':
        Run('--model=ViT-Ze/4 --image_size=28 --batch_size=8 --steps=2'),
    # docs/experiments.md
    f'{_PY} analyze --workdir=runs/default': Run(),
    # docs/scaling.md: the launchers print their commands (gcloud; the batch script, sbatch,
    # squeue, scancel) instead of running them.
    'python -m vit_jax launch --tpu=vit-v3-32 --zone=europe-west4-a --sync --setup --':
        Run(replace=(('--setup --', '--setup --dry_run --'),)),
    'python -m vit_jax launch --tpu=vit-v3-32 --zone=europe-west4-a --status': Run('--dry_run'),
    'python -m vit_jax launch --tpu=vit-v3-32 --zone=europe-west4-a --stop': Run('--dry_run'),
    'python -m vit_jax launch --slurm --nodes=2 --gpus_per_node=8 --time=24:00:00 --':
        Run(replace=(('--time=24:00:00 --', '--time=24:00:00 --dry_run --'),)),
    'python -m vit_jax launch --slurm --status': Run('--dry_run'),
    'python -m vit_jax launch --slurm --logs': Run('--dry_run'),
    'python -m vit_jax launch --slurm --stop': Run('--dry_run'),
    # docs/recipes.md
    'python -m vit_jax.main --config=configs/pretrain.py:model=B/16,dataset=imagenet21k --workdir':
        Fails(_NO_DATA),
    'python -m vit_jax.main --config=configs/pretrain.py:model=B/16,dataset=imagenet21k,augreg':
        Fails(_ELIDED),
    'python -m vit_jax.main --config=configs/pretrain.py:model=L/16,dataset=jft300m':
        Fails(_ELIDED),
    'python -m vit_jax.main --config=configs/finetune.py:model=B/16,dataset=cifar10 --config.init':
        Fails(_NOT_PREPARED),
    'python -m vit_jax.main --config=configs/finetune.py:model=B/16,dataset=cifar10,dev':
        Fails(_ELIDED),
    'python -m vit_jax.main --config=configs/finetune.py:model=L/16,dataset=imagenet2012':
        Fails(_ELIDED),
    'python -m vit_jax fewshot --workdir=runs/i21k':
        Fails(r'^error: (--workdir=\S+/runs/i21k does not exist|no checkpoints in \S+/runs/i21k/)'),
    'W=runs/recipes; python -m vit_jax.main --config=configs/pretrain.py:model=Mu/4,dataset=mnist5k':
        Run(_FAST_TRAIN, replace=_ZE),
    'W=runs/recipes; python -m vit_jax.main --config=configs/finetune.py:model=Mu/4':
        Run(_FAST_TRAIN, replace=_ZE),
    'W=runs/recipes; python -m vit_jax fewshot --workdir=$W/pre_sup': Run(),
    'python -m vit_jax.main --config=configs/pretrain.py:model=B/16,dataset=imagenet2012 --workdir':
        Fails(_NO_DATA),
    # docs/evaluation.md
    'python -m vit_jax evaluate --workdir=runs/default --evals=knn,linear_probe,fewshot': Run(),
    # The VTAB tasks are not prepared here: the command stops at its first task's dataset.
    'python -m vit_jax evaluate --workdir=runs/default --evals=vtab':
        Fails(_NOT_PREPARED, append='--data_dir=runs/no_vtab_data'),
    # docs/data.md, docs/evaluation.md: an op and an evaluator of a config file's own
    'python -m vit_jax.main --config=configs/extending.py --workdir=runs/extending':
        Run(_FAST_ZE),
    # docs/data.md
    'python -m vit_jax bench --mode=input --input_data=archive':
        Run(replace=(('--batch_size=32', '--batch_size=8 --steps=2 --input_size=64 '
                                         '--data_dir=runs/bench_input'),)),
    # docs/gpu.md: here there is no GPU.
    'python -m vit_jax bench --model=ViT-Ti/16 --batch_size=8 --config.model.attention=cudnn':
        Fails(r'^error: model.attention=cudnn is an NVIDIA GPU kernel'),
    'python -m vit_jax bench --suite=gpu': Fails(r'^error: --suite=gpu times on an NVIDIA GPU'),
    'python -m vit_jax bench --suite=smoke': Run(),
    # The compile for an H100 runs with a tiny model; bench's, without the compiler (its line).
    f'{_PY}.main --config=configs/default.py --workdir=/tmp/plan --config.compile_for=h100':
        Run(replace=(('ViT-Ti/16', 'ViT-Ze/4'), ('--config.image_size=224',
                                                  '--config.image_size=28'),
                     ('--config.batch_size=256', '--config.batch_size=8'))),
    'python -m vit_jax bench --compile_for=h100':
        Fails(r'^error: compiling for an NVIDIA GPU without one needs the XLA:GPU compiler',
              replace=(('python -m', 'VIT_JAX_GPU_COMPILER=/nonexistent python -m'),)),
    'python -m vit_jax.main --config=configs/default.py --workdir=runs/fp8':
        Fails(r'^error: --config\.model\.fp8=True needs an NVIDIA GPU with fp8 tensor cores'),
    'python -m vit_jax bench --model=ViT-B/16 --batch_size=256 --dtype=bfloat16 --config.model.fp8':
        Fails(r'^error: --config\.model\.fp8=True needs an NVIDIA GPU with fp8 tensor cores'),
    'PYTHONPATH=. python benchmarks/fp8_curve.py': Exempt(
        'trains twice on an NVIDIA GPU; tests/test_benchmark.py runs it on a CPU (fp8 emulated) '
        'through benchmarks/gpu_session.sh'),
}


def _strip_comment(line: str) -> str:
  """`line` without a shell comment (a `#` at the start or after a blank, outside quotes)."""
  quote = None
  for i, ch in enumerate(line):
    if quote:
      quote = None if ch == quote else quote
    elif ch in '\'"':
      quote = ch
    elif ch == '#' and (i == 0 or line[i - 1].isspace()):
      return line[:i].rstrip()
  return line.rstrip()


def commands_in(text: str) -> list:
  """The commands of the fenced code blocks of Markdown `text`, continuations joined, comments
  dropped, each preceded by the variable assignments made before it in its block."""
  found, in_block, pending, assigned = [], False, '', []
  for raw in text.splitlines():
    if raw.lstrip().startswith('```'):
      in_block, pending, assigned = not in_block, '', []
      continue
    if not in_block:
      continue
    line = pending + raw.strip()
    if line.endswith('\\'):
      pending = line[:-1].rstrip() + ' '
      continue
    pending = ''
    line = ' '.join(_strip_comment(line).split())
    if _ASSIGNMENT.match(line):
      assigned.append(line)
    elif _STARTS.match(line):
      found.append('; '.join([*assigned, line]))  # assigned first, as the shell reads them
  return found


def documented_commands() -> list:
  """(file, command) for every command of README.md and docs/*.md."""
  files = ['README.md'] + sorted(
      os.path.join('docs', f) for f in os.listdir(os.path.join(ROOT, 'docs')) if f.endswith('.md'))
  out = []
  for name in files:
    with open(os.path.join(ROOT, name), encoding='utf-8') as f:
      out += [(name, c) for c in commands_in(f.read())]
  return out


def entry_for(command: str):
  matches = [p for p in COMMANDS if command.startswith(p)]
  return COMMANDS[max(matches, key=len)] if matches else None


def test_commands_are_extracted_as_the_shell_reads_them():
  text = '\n'.join([
      'Some prose with `python -m vit_jax` inline.',
      '```',
      '# a comment line',
      'W=runs/x',
      '.venv/bin/python -m vit_jax.main --config=a.py \\',
      '    --workdir=$W/one   # trailing comment',
      "python -m vit_jax launch -- 'echo #x not a comment'",
      'PYTHONPATH=. .venv/bin/python benchmarks/speed_table.py --rows=a',
      'compile-only: ViT-H/14 (output, not a command)',
      'gcloud compute tpus tpu-vm create x',
      '```',
      '```',
      'make train    # builds .venv',
      '```',
  ])
  assert commands_in(text) == [
      'W=runs/x; .venv/bin/python -m vit_jax.main --config=a.py --workdir=$W/one',
      "W=runs/x; python -m vit_jax launch -- 'echo #x not a comment'",
      'W=runs/x; PYTHONPATH=. .venv/bin/python benchmarks/speed_table.py --rows=a',
      'make train',
  ]
  # A variable assigned on its own line is set when the next command's words are expanded.
  (command,) = commands_in('```\nW=runs/x\npython3 -c "import sys; print(sys.argv[1])" $W/one\n```')
  out = subprocess.run(['bash', '-c', command], capture_output=True, text=True, check=True).stdout
  assert out == 'runs/x/one\n'


def test_the_longest_registered_prefix_decides():
  assert isinstance(entry_for('make train WORKDIR=runs/x'), Exempt)
  assert isinstance(entry_for('make test-fast'), Exempt)  # 'make test' covers the make test-*
  assert entry_for(f'{_PY} predict --workdir=runs/default a.png') == Run()
  assert entry_for('python -m vit_jax unknown') is None


def test_every_command_is_registered():
  missing = [f'{name}: {c}' for name, c in documented_commands() if entry_for(c) is None]
  assert not missing, ('commands shown in the docs without an entry in COMMANDS of '
                       'tests/test_docs_commands.py (register each by a prefix):\n' +
                       '\n'.join(missing))


def _digit_png(path):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.zeros((28, 28), np.uint8)
  pixels[6:22, 12:16] = 255  # a one
  Image.fromarray(pixels).save(path)


@pytest.fixture(scope='module')
def home(tmp_path_factory):
  """The directory the commands see as the repository's `runs/` parent: `runs/default` trained
  for 2 steps (a ViT-Ze/4, as `make train` leaves a run) and `digit.png`."""
  base = tmp_path_factory.mktemp('docs_commands')
  subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py:model_name=ViT-Ze/4',
       f'--workdir={base}/runs/default', *_FAST_TRAIN.split()],
      cwd=ROOT, env=_env(), check=True, capture_output=True)
  _digit_png(base / 'digit.png')
  return base


def _env():
  env = dict(os.environ)
  env['PATH'] = os.path.join(ROOT, '.venv', 'bin') + os.pathsep + env.get('PATH', '')
  env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  return env


def _as_run_here(command: str, entry, home) -> str:
  for old, new in entry.replace:
    command = command.replace(old, new)
  command = re.sub(r'(?<![\w/.-])runs/', f'{home}/runs/', command)
  command = re.sub(r'(?<![\w/.-])digit\.png\b', f'{home}/digit.png', command)
  return f'{command} {entry.append}'.strip()


def _pages() -> list:
  """The pages that show commands, in documented_commands' order."""
  return list(dict.fromkeys(name for name, _ in documented_commands()))


@pytest.mark.slow
@pytest.mark.parametrize('page', _pages())
def test_every_documented_command_runs_as_written(page, home):
  """Each page's commands in order (a page's later commands may use its earlier ones' runs); a
  command already shown on an earlier page runs there only."""
  pages = _pages()
  before = set(pages[:pages.index(page)])
  failures, earlier, ran = [], set(), set()
  for name, command in documented_commands():
    if name in before:
      earlier.add(command)
    if name != page:
      continue
    entry = entry_for(command)
    if entry is None or isinstance(entry, Exempt) or command in earlier:
      continue  # test_every_command_is_registered names the unregistered ones
    shell = _as_run_here(command, entry, home)
    if shell in ran:
      continue  # the same command shown twice on the page
    ran.add(shell)
    proc = subprocess.run(['bash', '-c', shell], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    last = (proc.stderr.strip().splitlines() or [''])[-1]
    if isinstance(entry, Run):
      ok = proc.returncode == 0
      want = 'exit 0'
    else:
      ok = proc.returncode == 2 and last.startswith('error:') and re.search(entry.error, last)
      want = f'exit 2 and a last line matching {entry.error!r}'
    if not ok:
      failures.append(f'{name}: {command}\n  ran: {shell}\n  wanted {want}, got exit '
                      f'{proc.returncode}; stderr ends:\n    ' +
                      '\n    '.join(proc.stderr.strip().splitlines()[-5:]))
  assert not failures, '\n'.join(failures)
