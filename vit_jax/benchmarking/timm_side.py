"""The same model in timm (PyTorch) for a side-by-side benchmark (`--compare=timm`).

The timm model is built from this project's model description (`timm_layout.timm_config`: same
depth, width, heads, patch, classifier and the tanh GELU). On the CPU (`steps`): in the same
dtype, trained with the same optimizer family (Adam on softmax cross-entropy), one synthetic
batch, all CPU threads. On a CUDA GPU (`gpu_benchmark`, the GPU suite's timm runs, one process
each: `python -m vit_jax.benchmarking.timm_side '<json spec>'`): fp32 parameters under bf16
autocast, fused AdamW, gradient norm clipped at 1.0, eager or torch.compile'd, as timm's own
training script runs it.
Needs torch and timm: `make test-interop` installs them into .venv.
"""

import json
import os
import statistics
import sys
import time
from typing import Callable, List, Tuple

from vit_jax.errors import UserError


def _import_torch_and_timm():
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import timm  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    if getattr(e, 'name', '') and e.name.split('.')[0] == 'torchvision':
      raise UserError('--compare=timm: timm imports torchvision, which is not installed: pip '
                      'install the torchvision build of your torch, or, where there is none (no '
                      'CPU wheel for torch 2.13), put the test stand-in first: '
                      'PYTHONPATH=tests/interop/stubs') from None
    raise UserError(f'--compare=timm needs torch and timm ({e}): run `make test-interop` once, '
                    f'which installs them into .venv') from None
  return torch, timm


def build(model_name: str, num_classes: int, image_size: int, dtype: str):
  """(torch module, torch dtype) for our variant `model_name`."""
  torch, timm = _import_torch_and_timm()
  from vit_jax.models import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.formats import timm_layout  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  config = timm_layout.timm_config(spec_lib.ModelSpec(model_name=model_name,
                                                      num_classes=num_classes,
                                                      image_size=image_size, channels=3))
  if config['architecture'] is not None:
    model = timm.create_model(config['architecture'], pretrained=False, **config['kwargs'])
  elif config['resnet'] is None:
    from timm.models import vision_transformer  # pylint: disable=g-import-not-at-top
    model = vision_transformer.VisionTransformer(**config['kwargs'])
  else:
    raise UserError(f'{model_name} has no timm counterpart to compare with')
  torch_dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]
  return model.to(torch_dtype), torch_dtype


def steps(model_name: str, batch_size: int, image_size: int, dtype: str,
          num_classes: int = 1000) -> Tuple[Callable[[], None], Callable[[], None]]:
  """(train_step, infer_step) closures on one synthetic batch."""
  torch, _ = _import_torch_and_timm()
  model, torch_dtype = build(model_name, num_classes, image_size, dtype)
  generator = torch.Generator().manual_seed(0)
  images = (torch.rand(batch_size, 3, image_size, image_size, generator=generator) * 2 - 1).to(
      torch_dtype)
  labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
  loss_fn = torch.nn.CrossEntropyLoss()

  def train_step():
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(images).float(), labels)
    loss.backward()
    optimizer.step()

  def infer_step():
    model.eval()
    with torch.inference_mode():
      model(images)

  return train_step, infer_step


def torch_profile(step: Callable[[], None], steps: int = 2, top: int = 15) -> List[dict]:
  """torch.profiler's top ops of `step` by self CPU time: [{op, ms_per_step, share}]."""
  torch, _ = _import_torch_and_timm()
  step()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
      step()
  events = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
  total = sum(t for _, t in events) or 1.
  events.sort(key=lambda kv: -kv[1])
  return [{'op': key, 'ms_per_step': t / 1e3 / steps, 'share': t / total}
          for key, t in events[:top]]


def gpu_benchmark(model: str, batch_size: int, image_size: int, mode: str, compiled: bool,
                  steps: int, num_classes: int = 1000, warmup: int = 2) -> dict:
  """img/s (median of `steps` synchronised steps after the first and `warmup` more), the first
  result's time (from building the model), the allocator peak and MFU of timm on the GPU."""
  torch, _ = _import_torch_and_timm()
  if not torch.cuda.is_available():
    raise UserError('the timm GPU benchmark needs a CUDA GPU that torch can see')
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.models import cost  # pylint: disable=g-import-not-at-top
  from vit_jax.platform import chips  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  net, _ = build(model, num_classes, image_size, 'float32')
  net = net.cuda().train(mode == 'train')
  run = torch.compile(net) if compiled else net
  generator = torch.Generator(device='cuda').manual_seed(0)
  images = torch.rand(batch_size, 3, image_size, image_size, device='cuda',
                      generator=generator) * 2 - 1
  labels = torch.randint(0, num_classes, (batch_size,), device='cuda', generator=generator)
  optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)

  def train_step():
    with torch.autocast('cuda', dtype=torch.bfloat16):
      loss = torch.nn.functional.cross_entropy(run(images).float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()

  def infer_step():
    with torch.inference_mode(), torch.autocast('cuda', dtype=torch.bfloat16):
      run(images)

  step = train_step if mode == 'train' else infer_step
  step()
  torch.cuda.synchronize()
  first_s = time.perf_counter() - start
  for _ in range(warmup):
    step()
  torch.cuda.synchronize()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
  ours = models.create_model(model, num_classes=num_classes)
  shape = (image_size, image_size, 3)
  flops = (cost.train_flops if mode == 'train' else cost.forward_flops)(ours, shape)
  img_per_s = batch_size / statistics.median(times)
  name = torch.cuda.get_device_name()
  peak = chips.datasheet_peak(name, 'bfloat16')
  return {'img_per_s': img_per_s, 'step_s_all': times, 'first_s': first_s,
          'peak_bytes': int(torch.cuda.max_memory_allocated()), 'device_name': name,
          'flops_per_img': flops, 'mfu': img_per_s * flops / peak if peak else None,
          'torch': torch.__version__}


def main(argv: List[str]) -> int:
  """`python -m vit_jax.benchmarking.timm_side '<json spec>'`: one `gpu_benchmark` as JSON."""
  try:
    spec = json.loads(argv[1])
    print(json.dumps(gpu_benchmark(**spec)))
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


__all__ = ['build', 'steps', 'torch_profile', 'gpu_benchmark']


if __name__ == '__main__':
  sys.exit(main(sys.argv))
