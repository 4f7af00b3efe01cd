"""A stand-in for `gcloud compute tpus tpu-vm` (tests/test_launch_e2e.py puts it on PATH).

Each worker I of the TPU VM is the directory $FAKE_TPU_ROOT/worker<I>, its home: `scp SRC NAME:DEST`
copies into it, `ssh --command=SCRIPT` runs `bash -c SCRIPT` there (HOME set to it; --worker=all
runs every worker at once, as gcloud does), `describe` lists $FAKE_TPU_WORKERS endpoints. What a
TPU VM's metadata gives each worker, its place in the distributed run, comes as the environment
variables vit_jax reads (VIT_JAX_COORDINATOR_ADDRESS = $FAKE_TPU_COORDINATOR, VIT_JAX_NUM_PROCESSES,
VIT_JAX_PROCESS_ID). A worker listed in $FAKE_TPU_DOWN does not answer (ssh exits 255). Every call
is appended to $FAKE_TPU_ROOT/calls.jsonl.
"""

import json
import os
import shutil
import subprocess
import sys


def _flag(args, name):
  for a in args:
    if a.startswith(f'--{name}='):
      return a.split('=', 1)[1]
  return None


def main(argv):
  root, count = os.environ['FAKE_TPU_ROOT'], int(os.environ['FAKE_TPU_WORKERS'])
  down = {int(w) for w in os.environ.get('FAKE_TPU_DOWN', '').split(',') if w}
  with open(os.path.join(root, 'calls.jsonl'), 'a') as f:
    f.write(json.dumps(argv) + '\n')
  assert argv[:3] == ['compute', 'tpus', 'tpu-vm'], argv
  verb, args = argv[3], argv[4:]
  if verb == 'describe':
    print(json.dumps({'name': args[0], 'networkEndpoints': [
        {'ipAddress': f'10.0.0.{i + 2}'} for i in range(count)]}))
    return 0
  worker = _flag(args, 'worker')
  workers = range(count) if worker == 'all' else [int(worker)]
  homes = [os.path.join(root, f'worker{i}') for i in workers]
  for home in homes:
    os.makedirs(home, exist_ok=True)
  if verb == 'scp':
    src, dest = [a for a in args if not a.startswith('--')]
    for i, home in zip(workers, homes):
      if i in down:
        print(f'ssh: connect to worker {i}: Connection timed out', file=sys.stderr)
        return 255
      shutil.copy(src, os.path.join(home, dest.split(':', 1)[1]))
    return 0
  assert verb == 'ssh', argv
  script = _flag(args, 'command')
  procs = []
  for i, home in zip(workers, homes):
    if i in down:
      continue
    env = dict(os.environ, HOME=home, VIT_JAX_COORDINATOR_ADDRESS=os.environ['FAKE_TPU_COORDINATOR'],
               VIT_JAX_NUM_PROCESSES=str(count), VIT_JAX_PROCESS_ID=str(i))
    procs.append(subprocess.Popen(['bash', '-c', script], cwd=home, env=env))
  codes = [p.wait() for p in procs]
  if any(i in down for i in workers):
    print(f'ssh: connect to worker {min(down)}: Connection timed out', file=sys.stderr)
    return 255
  return max(codes, default=0)


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
