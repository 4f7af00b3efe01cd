"""Two processes on 127.0.0.1 (gloo CPU collectives), two simulated devices each: one global run."""

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_two_process_run_shares_one_global_batch_and_checkpoint(tmp_path, data_dir):
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2')
  workdir = tmp_path / 'work'
  procs = [
      subprocess.Popen(
          [sys.executable, '-m', 'vit_jax.main',
           '--config=configs/default.py:model_name=ViT-Ze/4,steps=6,batch_size=32',
           f'--workdir={workdir}', f'--config.data_dir={data_dir}', '--config.warmup_steps=1',
           '--config.log_every=3', '--config.eval_every=3', '--config.checkpoint_every=3',
           f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  outs = [p.communicate(timeout=400) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err
  finals = [out.strip().splitlines()[-1] for out, _ in outs]
  # Both processes report the same evaluation, which counted every test example exactly once.
  assert finals[0] == finals[1] and finals[0].endswith('(1000 examples)'), finals
  assert 'on 4 device(s)' in outs[0][1]
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['3', '6']
  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  # Only process 0 writes metrics: each step appears once per split.
  assert [(r['step'], r['split']) for r in records] == [
      (3, 'train'), (3, 'eval'), (6, 'train'), (6, 'eval')]
  assert all(r['count'] == 1000 for r in records if r['split'] == 'eval')
