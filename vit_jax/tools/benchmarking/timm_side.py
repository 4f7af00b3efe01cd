"""The same model in timm (PyTorch) for a side-by-side benchmark (`--compare=timm`).

The timm model is built from this project's model description (`timm_layout.timm_config`: same
depth, width, heads, patch, classifier and the tanh GELU). On the CPU (`steps`): in the same
dtype, trained with the same optimizer family (Adam on softmax cross-entropy), one synthetic
batch, all CPU threads. On a CUDA GPU (`gpu_benchmark`, the GPU suite's timm runs, one process
each: `python -m vit_jax.tools.benchmarking.timm_side '<json spec>'`): fp32 parameters under bf16
autocast, fused AdamW, gradient norm clipped at 1.0, eager or torch.compile'd, as timm's own
training script runs it (with `device='cpu'` the same step on the CPU, for the smoke suite).
`kernel_profile` is torch.profiler's view of a step in our profile's kernel classes
(vit_jax/tools/benchmarking/profile.py): the GPU's kernels, or on a CPU the ATen ops' own time.
Needs torch and timm: `make test-interop` installs them into .venv.
"""

import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

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


def kernel_profile(step: Callable[[], None], sync: Callable[[], None], device: str,
                   steps: int = 3, top: int = 40) -> dict:
  """torch.profiler's kernels of `steps` calls of `step` in our profile's schema
  (`profile.summarize`: 'kernel_ms_per_step', 'classes', 'top' [name, class, ms per step]).

  On a GPU: every CUDA kernel, classed by its name and the ops that launched it
  (`profile.kernel_class`); on a CPU: each op's own (self) time, classed likewise.
  """
  torch, _ = _import_torch_and_timm()
  from vit_jax.tools.benchmarking import profile  # pylint: disable=g-import-not-at-top
  cuda = device == 'cuda'
  activities = [torch.profiler.ProfilerActivity.CPU]
  if cuda:
    activities.append(torch.profiler.ProfilerActivity.CUDA)
  step()
  sync()
  with torch.profiler.profile(activities=activities) as prof:
    for _ in range(steps):
      step()
    sync()
  events = list(prof.events())
  cpu = torch.autograd.DeviceType.CPU
  ops = {e.id: e for e in events if e.device_type == cpu}

  def context(op) -> List[str]:
    names = []
    while op is not None:
      names.append(op.name)
      op = op.cpu_parent
    return names[::-1]

  times: Dict[Tuple[str, str], float] = {}
  for e in events:
    if cuda and e.device_type != cpu:
      key = (e.name, profile.kernel_class(
          e.name, context(ops.get(getattr(e, 'linked_correlation_id', 0)))))
      us = e.time_range.elapsed_us()
    elif not cuda and e.device_type == cpu:
      key, us = (e.name, profile.kernel_class(e.name, context(e.cpu_parent))), e.self_cpu_time_total
    else:
      continue
    times[key] = times.get(key, 0.) + us / 1e3 / steps
  ranked = sorted(([name, cls, t] for (name, cls), t in times.items()), key=lambda r: -r[2])
  source = 'torch.profiler, ' + ('CUDA kernels' if cuda else "each op's own CPU time")
  return {'kernel_ms_per_step': sum(times.values()), 'source': source, **profile.by_class(ranked),
          'top': ranked[:top]}


def gpu_benchmark(model: str, batch_size: int, image_size: int, mode: str, compiled: bool,
                  steps: int, num_classes: int = 1000, warmup: int = 2, device: str = 'cuda',
                  dtype: str = 'bfloat16', profile: bool = False) -> dict:
  """img/s (median of `steps` synchronised steps after the first and `warmup` more), the first
  result's time (from building the model), the allocator peak and MFU of timm on the GPU
  (`device='cpu'`: on the CPU, no allocator peak or MFU); `dtype` bfloat16 runs under autocast.
  `profile` adds `kernel_profile` of the step under 'profile'."""
  torch, timm = _import_torch_and_timm()
  cuda = device == 'cuda'
  if cuda and not torch.cuda.is_available():
    raise UserError('the timm GPU benchmark needs a CUDA GPU that torch can see')
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.models import cost  # pylint: disable=g-import-not-at-top
  from vit_jax.platform import chips  # pylint: disable=g-import-not-at-top
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  start = time.perf_counter()
  net, _ = build(model, num_classes, image_size, 'float32')
  net = net.to(device).train(mode == 'train')
  run = torch.compile(net) if compiled else net
  generator = torch.Generator(device=device).manual_seed(0)
  images = torch.rand(batch_size, 3, image_size, image_size, device=device,
                      generator=generator) * 2 - 1
  labels = torch.randint(0, num_classes, (batch_size,), device=device, generator=generator)
  optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=cuda)
  autocast = lambda: torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == 'bfloat16')

  def train_step():
    with autocast():
      loss = torch.nn.functional.cross_entropy(run(images).float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()

  def infer_step():
    with torch.inference_mode(), autocast():
      run(images)

  step = train_step if mode == 'train' else infer_step
  step()
  sync()
  first_s = time.perf_counter() - start
  for _ in range(warmup):
    step()
  sync()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    step()
    sync()
    times.append(time.perf_counter() - t0)
  ours = models.create_model(model, num_classes=num_classes)
  shape = (image_size, image_size, 3)
  flops = (cost.train_flops if mode == 'train' else cost.forward_flops)(ours, shape)
  img_per_s = batch_size / statistics.median(times)
  name = torch.cuda.get_device_name() if cuda else 'cpu'
  peak = chips.datasheet_peak(name, dtype)
  out = {'img_per_s': img_per_s, 'step_s_all': times, 'first_s': first_s,
         'peak_bytes': int(torch.cuda.max_memory_allocated()) if cuda else None,
         'device_name': name, 'flops_per_img': flops,
         'mfu': img_per_s * flops / peak if peak else None, 'torch': torch.__version__,
         'versions': {'torch': torch.__version__, 'timm': timm.__version__}}
  if profile:
    out['profile'] = kernel_profile(step, sync, device)
  return out


def main(argv: List[str]) -> int:
  """`python -m vit_jax.tools.benchmarking.timm_side '<json spec>'`: one `gpu_benchmark` as JSON."""
  try:
    spec = json.loads(argv[1])
    print(json.dumps(gpu_benchmark(**spec)))
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


__all__ = ['build', 'steps', 'kernel_profile', 'gpu_benchmark']


if __name__ == '__main__':
  sys.exit(main(sys.argv))
