"""A train run is built once: the config validated once, its task resolved once, its op lists
parsed once, the mesh and the model built once, and handed down from the train command to the
program and the loop."""

import json
import subprocess
import sys

from helpers import ROOT

# Counts the calls of the functions that validate a config and build a mesh or a model, wherever
# they are called from, then runs the train command (`python -m vit_jax.main`) as __main__.
_COUNTING_RUN = '''
import atexit, collections, json, runpy, sys
import vit_jax.models, vit_jax.parallel, vit_jax.parallel.mesh, vit_jax.tasks
from vit_jax.data import ops
from vit_jax.train import validate
calls = collections.Counter()

def counted(module, name, key):
  fn = getattr(module, name)
  def wrapper(*args, **kwargs):
    calls[key] += 1
    return fn(*args, **kwargs)
  setattr(module, name, wrapper)

counted(validate, 'check_config', 'validate')
counted(vit_jax.parallel.mesh, 'make_mesh', 'mesh')
vit_jax.parallel.make_mesh = vit_jax.parallel.mesh.make_mesh
counted(vit_jax.models, 'create_model', 'model')
counted(vit_jax.tasks, 'get_task', 'task')
counted(ops, 'parse', 'parse')  # each op list (pp.train, pp.eval) parsed once
atexit.register(lambda: print('calls', json.dumps(dict(calls)), flush=True))
sys.argv = ['vit_jax.main', *sys.argv[1:]]
runpy.run_module('vit_jax.main', run_name='__main__', alter_sys=True)
'''


def test_a_train_run_validates_its_config_and_builds_its_task_ops_mesh_and_model_once(tmp_path,
                                                                                   data_dir):
  proc = subprocess.run(
      [sys.executable, '-c', _COUNTING_RUN,
       '--config=configs/default.py:model_name=ViT-Ze/4,steps=2,batch_size=32',
       f'--workdir={tmp_path}', f'--config.data_dir={data_dir}', '--config.warmup_steps=1',
       '--config.progress=False'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert 'final test top-1 accuracy:' in proc.stdout
  counts = json.loads(proc.stdout.split('calls ', 1)[1])
  assert counts == {'validate': 1, 'task': 1, 'parse': 2, 'mesh': 1, 'model': 1}, counts
