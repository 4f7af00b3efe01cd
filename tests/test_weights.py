"""Official weights by name (vit_jax/formats/weights.py), against a local mirror of the bucket.

The mirror is a directory written by the test (VIT_JAX_WEIGHTS_URL=file://...): at the real file
names it holds a tiny ViT-Ze/4 .npz in the released layout, standing in for the real (37 MiB to
2.4 GiB) files. Names resolve to the real bucket paths and variants; downloads go to the cache
once, atomically (size checked against Content-Length, a killed download leaves no file that looks
complete), and are then used without the network.
"""

import http.server
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from vit_jax.analysis import inputs
from vit_jax.errors import UserError
from vit_jax.formats import npz, weights
from vit_jax.models import create_model, decode_variant
from vit_jax.serving import bundle as bundle_lib
from vit_jax.train import transfer
from helpers import ROOT, free_port

B16 = 'ViT-B/16@imagenet21k'


def test_names_map_to_the_official_files_and_real_variants():
  assert weights.lookup(B16).path == 'imagenet21k/ViT-B_16.npz'
  assert weights.lookup('ViT-L/16@imagenet21k+imagenet2012').path == \
      'imagenet21k+imagenet2012/ViT-L_16.npz'
  assert weights.lookup('R50+ViT-B/16@imagenet21k').path == 'imagenet21k/R50+ViT-B_16.npz'
  assert weights.lookup('ViT-B/16@augreg-i21k+imagenet2012').path == (
      'augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k'
      '-lr_0.03-res_384.npz')
  assert weights.lookup('R26+ViT-S/32@augreg-i21k').path == (
      'augreg/R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz')
  # 31 of gs://vit_models, 6 FlexiViT of gs://big_vision, 4 MLP-Mixer of gs://mixer_models
  assert len(weights.KNOWN) == 41
  for w in weights.KNOWN.values():
    decode_variant(w.model_name)  # every name is a variant of this codebase
    assert w.name.startswith(w.model_name + '@')
  with pytest.raises(UserError, match=r"unknown weights 'ViT-B/16@jft': known names include "
                                      r'ViT-B/16@augreg-i21k, '):
    weights.lookup('ViT-B/16@jft')
  assert not weights.is_name('runs/x') and not weights.is_name('gs://b/x@y.npz')


def _tiny_params(classes=3):
  model = create_model('ViT-Ze/4', num_classes=classes)
  params = model.init(jax.random.key(0), np.zeros((1, 28, 28, 3)), train=False)['params']
  params = jax.tree.map(np.asarray, params)
  params['head']['kernel'] = np.full(params['head']['kernel'].shape, 0.01, np.float32)
  return params


@pytest.fixture
def mirror(tmp_path, monkeypatch):
  """A bucket mirror with tiny stand-ins at two official paths; an empty cache."""
  root = tmp_path / 'mirror'
  for name in (B16, 'ViT-B/16@imagenet21k+imagenet2012'):
    path = root / weights.lookup(name).path
    path.parent.mkdir(parents=True, exist_ok=True)
    npz.save_npz(str(path), _tiny_params())
  monkeypatch.setenv(weights.URL_VAR, f'file://{root}')
  monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
  return root


def _cache_files(tmp_path):
  top = tmp_path / 'cache'
  return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)


def test_downloaded_once_then_used_offline(mirror, tmp_path):
  path = weights.fetch(B16)
  assert path == str(tmp_path / 'cache' / 'imagenet21k' / 'ViT-B_16.npz')
  assert open(path, 'rb').read() == (mirror / 'imagenet21k' / 'ViT-B_16.npz').read_bytes()
  assert _cache_files(tmp_path) == ['imagenet21k/ViT-B_16.npz']  # no temporary file left
  os.rename(mirror, tmp_path / 'gone')  # offline from now on
  assert weights.fetch(B16) == path
  # --config.init=NAME reads it (and refuses it: the stand-in is not a ViT-B/16, which the name
  # promises); predict/export/convert (bundle.resolve) and analyze read it as --model says.
  with pytest.raises(UserError, match=f'^{path} holds another model'):
    transfer.load_pretrained(B16)
  bundle = bundle_lib.resolve(checkpoint=B16, model='ViT-Ze/4')
  assert (bundle.spec.model_name, bundle.spec.num_classes, bundle.spec.image_size) == \
      ('ViT-Ze/4', 3, 28)
  with pytest.raises(UserError, match='ViT-B/16'):  # without --model: the name's own variant
    bundle_lib.resolve(checkpoint=B16)
  _, _, spec = inputs.load_params_file(B16, 'ViT-Ze/4')
  assert spec.num_classes == 3


def test_no_network_is_one_line_naming_the_address_and_the_place(tmp_path, monkeypatch):
  port = free_port()  # nothing listens there: the connection is refused
  monkeypatch.setenv(weights.URL_VAR, f'http://127.0.0.1:{port}/vit_models')
  monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
  with pytest.raises(UserError) as e:
    weights.fetch('ViT-L/16@imagenet21k+imagenet2012')
  text = str(e.value)
  assert text.startswith('cannot download ViT-L/16@imagenet21k+imagenet2012 (')
  assert (f'download http://127.0.0.1:{port}/vit_models/imagenet21k+imagenet2012/ViT-L_16.npz '
          f'(gs: gs://vit_models/imagenet21k+imagenet2012/ViT-L_16.npz) by hand to '
          f'{tmp_path}/cache/imagenet21k+imagenet2012/ViT-L_16.npz') in text
  assert '\n' not in text and _cache_files(tmp_path) == []


class _Server:
  """An HTTP server that announces `size` bytes, sends `sent` of them, then stalls or closes."""

  def __init__(self, size: int, sent: int, stall: bool):
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):  # pylint: disable=invalid-name
        self.send_response(200)
        self.send_header('Content-Length', str(size))
        self.end_headers()
        self.wfile.write(b'PK' + b'\0' * (sent - 2))
        self.wfile.flush()
        while stall and not outer.done.is_set():
          time.sleep(0.1)

      def log_message(self, *args):
        pass

    self.done = threading.Event()
    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
    self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'

  def close(self):
    self.done.set()
    self.httpd.shutdown()
    self.httpd.server_close()


def test_a_cut_download_leaves_nothing(tmp_path, monkeypatch):
  server = _Server(size=100_000, sent=40_000, stall=False)
  try:
    monkeypatch.setenv(weights.URL_VAR, server.url)
    monkeypatch.setenv(weights.DIR_VAR, str(tmp_path / 'cache'))
    with pytest.raises(UserError, match=r'the download of http://127.0.0.1:\d+/imagenet21k/'
                                        r'ViT-B_16.npz stopped after 40000 of 100000 bytes'):
      weights.fetch(B16)
  finally:
    server.close()
  assert _cache_files(tmp_path) == []


@pytest.mark.slow
def test_a_killed_download_never_looks_complete(mirror, tmp_path):
  server = _Server(size=10_000_000, sent=3_000_000, stall=True)
  env = dict(os.environ, **{weights.URL_VAR: server.url,
                            weights.DIR_VAR: str(tmp_path / 'cache')})
  try:
    proc = subprocess.Popen([sys.executable, '-m', 'vit_jax', 'weights', f'--fetch={B16}'],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = tmp_path / 'cache' / 'imagenet21k'
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        (part / f).stat().st_size >= 1_000_000 for f in (os.listdir(part) if part.exists() else [])):
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    server.close()
  left = os.listdir(tmp_path / 'cache' / 'imagenet21k')
  assert len(left) == 1 and left[0].startswith('.ViT-B_16.npz.') and left[0].endswith('.tmp')
  # The next command does not take the partial file for the weights: it downloads them. A
  # partial file idle for longer than a live download could be is removed; a fresh one (another
  # process downloading now) is kept.
  stale = part / left[0]
  os.utime(stale, (time.time() - 2 * weights.TIMEOUT_S - 5,) * 2)
  live = part / '.ViT-B_16.npz.another.tmp'
  live.write_bytes(b'partial')
  path = weights.fetch(B16)
  assert open(path, 'rb').read() == (mirror / 'imagenet21k' / 'ViT-B_16.npz').read_bytes()
  assert sorted(os.listdir(part)) == [live.name, 'ViT-B_16.npz']


@pytest.mark.slow
def test_cli_lists_the_names_and_fails_in_one_line_offline(tmp_path):
  env = dict(os.environ, **{weights.DIR_VAR: str(tmp_path / 'cache')})
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'weights'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) == len(weights.KNOWN) + 1
  assert lines[0].startswith('ViT-B/16@imagenet21k ') and 'gs://vit_models/imagenet21k/ViT-B_16.npz' \
      in lines[0] and lines[0].endswith('(not downloaded)')
  env[weights.URL_VAR] = f'http://127.0.0.1:{free_port()}'
  proc = subprocess.run([sys.executable, '-m', 'vit_jax', 'weights', f'--fetch={B16}'],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  (line,) = [l for l in proc.stderr.splitlines() if l.strip()]
  assert line.startswith(f'error: cannot download {B16} (') and 'by hand to' in line


@pytest.mark.slow
def test_analyze_official_weights_by_name_on_image_files(mirror, tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax import analysis  # pylint: disable=g-import-not-at-top
  png = str(tmp_path / 'a.png')
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 30, 3), np.uint8)).save(png)
  with pytest.raises(UserError, match='comes without a dataset: pass image files'):
    analysis.write_report(workdir=None, out=str(tmp_path / 'f'), checkpoint=B16, model='ViT-Ze/4')
  summary = analysis.write_report(workdir=None, out=str(tmp_path / 'f'), checkpoint=B16,
                                  model='ViT-Ze/4', images=[png], image_size=32)
  assert (summary['checkpoint'], summary['model_name'], summary['grid']) == \
      (B16, 'ViT-Ze/4', [8, 8])
  assert (tmp_path / 'f' / 'attention_rollout.png').stat().st_size > 1000


@pytest.mark.slow
def test_init_by_name_refuses_a_file_of_another_model_as_predict_does(mirror, tmp_path,
                                                                      data_dir):
  """The mirror serves a ViT-Ze/4 file as ViT-B/16's: a ViT-Ze/4 run could load it, and must
  not (the name promises ViT-B/16); predict refuses the same file with the same check."""
  from vit_jax.configs import mnist5k  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top
  line = (r'imagenet21k/ViT-B_16.npz holds another model \(width 32, 2 blocks\), not '
          r'ViT-B/16@imagenet21k \(ViT-B/16: width 768, 12 blocks\): delete it and fix the mirror '
          rf'at \${weights.URL_VAR} \(file://.*\)')
  with pytest.raises(UserError, match=line + '$'):
    transfer.load_pretrained(B16)
  config = mnist5k.get_config('model_name=ViT-Ze/4,steps=6,batch_size=16')
  config.data_dir, config.warmup_steps, config.init = data_dir, 1, B16
  with pytest.raises(UserError, match=line + '$'):
    loop.train_and_evaluate(config, str(tmp_path / 'work'))
  assert not (tmp_path / 'work').exists()
  with pytest.raises(UserError, match=line + ', or pass --model with the variant the file holds$'):
    bundle_lib.resolve(checkpoint=B16)
  assert bundle_lib.resolve(checkpoint=B16, model='ViT-Ze/4').spec.model_name == 'ViT-Ze/4'
  # The name's own model (the smallest released one) is read.
  ti = 'ViT-Ti/16@augreg-i21k'
  model = create_model('ViT-Ti/16', num_classes=5)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False)['params'],
                          jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32))
  path = mirror / weights.lookup(ti).path
  path.parent.mkdir(parents=True)
  npz.save_npz(str(path), jax.tree.map(lambda s: np.full(s.shape, 0.5, s.dtype), shapes))
  loaded = transfer.load_pretrained(ti)
  assert loaded.source == f'{ti} ({weights.local_path(weights.lookup(ti))})'
  np.testing.assert_array_equal(loaded.params['Transformer']['encoder_norm']['scale'],
                                np.full(192, 0.5, np.float32))
