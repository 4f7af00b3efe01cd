"""One benchmark run: our measurement, the matmul peak, and optionally timm timed alternately.

Alternation: `rounds` times, our step is timed `steps` times and then timm's; each side's img/s is
its median step time over all its timed steps, so slow phases of the machine hit both sides.
"""

import os
import statistics
import time
from typing import Optional

import numpy as np

from vit_jax.tools.benchmarking import ours
from vit_jax.tools.benchmarking import profile as profile_lib
from vit_jax.errors import UserError
from vit_jax.platform import cpus
from vit_jax.platform import chips

GIB = 2 ** 30


def synthetic_jpeg_folder(root: str, size: int, count: int = 256, classes: int = 8) -> str:
  """A folder of `count` smooth random JPEGs of about size x 3/4 size (made once)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  folder = os.path.join(root, f'synthetic_jpeg_{size}')
  done = os.path.join(folder, '.complete')
  if os.path.exists(done):
    return folder
  rng = np.random.default_rng(0)
  height = size * 3 // 4
  for i in range(count):
    coarse = rng.uniform(0, 255, (height // 16 + 1, size // 16 + 1, 3)).astype(np.uint8)
    image = Image.fromarray(coarse).resize((size, height), Image.BICUBIC)
    noise = rng.normal(0, 12, (height, size, 3))
    pixels = np.clip(np.asarray(image, np.float32) + noise, 0, 255).astype(np.uint8)
    directory = os.path.join(folder, f'class{i % classes}')
    os.makedirs(directory, exist_ok=True)
    Image.fromarray(pixels).save(os.path.join(directory, f'{i:04d}.jpg'), quality=90)
  open(done, 'w').close()
  return folder


def versions() -> dict:
  """The versions of the stack a figure was measured with (jax, jaxlib, flax, the CUDA plugin)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  out = {}
  for package in ('jax', 'jaxlib', 'flax', 'jax-cuda13-plugin', 'jax-cuda12-plugin'):
    try:
      out[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      pass
  return out


def run_benchmark(config, *, model: str, batch_size: int, image_size: int, mode: str,
                  dtype: str, steps: int, rounds: int = 3, compare_with: Optional[str] = None,
                  input_data: str = 'synthetic', input_size: int = 400,
                  data_dir: str = '/tmp/vit_jax_benchmark_data', profile: bool = False) -> dict:
  """One benchmark (result['processor']: the machine's, `cpus.describe`); `profile` adds a
  per-component kernel profile of our step (and, with `compare_with`, torch.profiler's profile of
  timm's in the same kernel classes, `timm_side.kernel_profile`) under 'profile' /
  'timm_profile'."""
  if mode != 'train' and config.model.get('fp8'):
    raise UserError('--config.model.fp8 makes the training step\'s dense layers fp8; a forward '
                    f'pass (--mode={mode}) runs them in --dtype: drop it or use --mode=train')
  ours.set_benchmark_values(config, model, batch_size, image_size, dtype)
  result = {'model': model, 'mode': mode, 'batch_size': batch_size, 'image_size': image_size,
            'dtype': dtype, 'steps': steps, 'processor': cpus.describe(),
            'versions': versions()}
  if mode == 'input':
    dataset = input_data
    if input_data == 'synthetic':
      dataset = 'folder:' + synthetic_jpeg_folder(data_dir, input_size)
    result['input_data'] = dataset
    result.update(ours.input_pipeline(config, data_dir, dataset, batches=steps))
    result.update({'matmul_peak_flops': 0.0, 'utilization': 0.0, 'mfu': 0.0})
    return result

  # The step is built first: a config the step refuses (fp8 or cuDNN attention on a device
  # without them, a bad mesh) stops before the matmul rates are measured.
  prepared = ours.prepare_train(config) if mode == 'train' else ours.prepare_infer(config)
  peak = ours.matmul_peak_flops()
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  result['device_kind'] = device.device_kind
  result['chip_peak_flops'], result['chip_peak_source'] = chips.peak_flops(
      [device], dtype,
      measure=lambda d: peak if d == 'float32' else ours.matmul_peak_flops(dtype=d))
  theirs_step = None
  if compare_with is None:
    result.update(prepared.measure(steps))
  else:
    from vit_jax.tools.benchmarking import timm_side  # pylint: disable=g-import-not-at-top  # torch
    train_step, infer_step = timm_side.steps(config.model_name, config.batch_size,
                                             config.image_size, config.model.dtype)
    theirs_step = train_step if mode == 'train' else infer_step
    result.update(_alternate(config, prepared, theirs_step, steps, rounds))
  if profile:
    result['profile'] = profile_lib.profile_step(prepared.step, prepared.hlo_text)
    if theirs_step is not None:
      result['timm_profile'] = timm_side.kernel_profile(theirs_step, lambda: None, 'cpu')
  result['matmul_peak_flops'] = peak
  result['utilization'] = result['achieved_flops'] / peak
  result['mfu'] = result['achieved_flops'] / result['chip_peak_flops']
  return result


def _alternate(config, prepared, theirs_step, steps: int, rounds: int) -> dict:
  start = time.perf_counter()
  theirs_step()
  theirs_first = time.perf_counter() - start
  out, ours_times, theirs_times = None, [], []
  for _ in range(rounds):
    measured = prepared.measure(steps)
    out = out or measured
    ours_times += measured['step_s_all']
    theirs_times += ours.time_calls(theirs_step, steps, warmup=1).seconds
  b = config.batch_size
  step_s = statistics.median(ours_times)
  out = dict(out, img_per_s=b / step_s, step_s=step_s, step_s_all=ours_times,
             achieved_flops=prepared.flops_per_step / step_s,
             timm_img_per_s=b / statistics.median(theirs_times), timm_first_step_s=theirs_first,
             timm_step_s_all=theirs_times)
  out['ratio_vs_timm'] = out['img_per_s'] / out['timm_img_per_s']
  return out


def format_result(r: dict) -> str:
  lines = [f'{r["model"]} {r["mode"]} batch {r["batch_size"]} at {r["image_size"]} px, '
           f'{r["dtype"]}, on {cpus.one_line(r["processor"])}:',
           f'  {r["img_per_s"]:.1f} img/s (median of {len(r.get("step_s_all", [])) or r["steps"]}'
           f' steps), first result after {r["compile_s"]:.1f} s']
  if r['mode'] != 'input':
    device = (f'; device allocator peak {r["device_peak_bytes"] / GIB:.2f} GiB'
              if r.get('device_peak_bytes') else '')
    lines += [f'  {r["flops_per_img"] / 1e9:.2f} GFLOP/img (the model\'s, from its shapes), '
              f'{r["achieved_flops"] / 1e9:.1f} GFLOP/s achieved = MFU {100 * r["mfu"]:.0f}% of '
              f'{r["chip_peak_flops"] / 1e9:.1f} GFLOP/s ({r["chip_peak_source"]}); '
              f'{100 * r["utilization"]:.0f}% of the measured fp32 matmul rate '
              f'({r["matmul_peak_flops"] / 1e9:.1f} GFLOP/s)',
              f'  compiled step peak {r["peak_bytes"] / GIB:.2f} GiB{device}; process peak RSS '
              f'{r["rss_peak_bytes"] / GIB:.2f} GiB; {r["minor_faults_per_step"]:,.0f} minor page '
              f'faults per step']
  if 'timm_img_per_s' in r:
    lines.append(f'  timm: {r["timm_img_per_s"]:.1f} img/s; ours / timm = '
                 f'{r["ratio_vs_timm"]:.2f}')
  if 'profile' in r:
    lines += ['ours, per component (jax.profiler):',
              profile_lib.format_profile(r['profile'], 1e3 * r['step_s'])]
    columns = [('ours', r['profile'])] + ([('timm', r['timm_profile'])]
                                          if 'timm_profile' in r else [])
    lines.append(profile_lib.format_class_table(columns, 'by kernel class (ms per step):'))
  return '\n'.join(lines)


__all__ = ['run_benchmark', 'format_result', 'synthetic_jpeg_folder', 'versions']
