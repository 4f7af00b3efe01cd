"""The same model in timm (PyTorch, CPU) for a side-by-side benchmark (`--compare=timm`).

The timm model is built from this project's model description (`timm_layout.timm_config`: same
depth, width, heads, patch, classifier and the tanh GELU), in the same dtype, and trained with the
same optimizer family: Adam on softmax cross-entropy, one synthetic batch, all CPU threads.
Needs torch and timm: `make test-interop` installs them into .venv.
"""

import os
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


__all__ = ['build', 'steps', 'torch_profile']
