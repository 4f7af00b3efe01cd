"""Convert params between formats: `python -m vit_jax convert SOURCE --out=FILE`.

--out=FILE.safetensors writes a timm / PyTorch state dict (with the model description and timm
constructor arguments in its metadata when the source has them); --out=FILE.npz writes the released
.npz layout. SOURCE flags as for predict (vit_jax/commands/flag_groups.py): --workdir
[--checkpoint=STEP], --bundle, or --checkpoint=FILE.npz|FILE.safetensors [--model=NAME]. A bare
.npz converts without --model; a .safetensors from timm needs --model (a state dict does not hold
the number of heads).

  python -m vit_jax convert --checkpoint=ViT-B_16.npz --out=vit_b16.safetensors
  python -m vit_jax convert --checkpoint=timm.safetensors --model=ViT-B/16 --out=vit_b16.npz
  python -m vit_jax convert --workdir=runs/default --out=mnist.safetensors
"""

import sys

from absl import flags

from vit_jax import cli
from vit_jax.commands import flag_groups

_SOURCE = flag_groups.model_source()
_OUT = flag_groups.out()
_DROP_PRE_LOGITS = flags.DEFINE_bool(
    'drop_pre_logits', False, 'Drop the pre_logits layer of an i21k checkpoint, which timm does '
    'not have (as timm does when it loads such a file).')


def run(argv) -> int:
  if len(argv) > 1:
    raise cli.UserError(f'unexpected arguments {" ".join(argv[1:])}: name the source with '
                        '--checkpoint, --workdir or --bundle')
  out = _OUT.value
  if not out.endswith(('.safetensors', '.npz')):
    raise cli.UserError(f'--out={out}: the extension chooses the format, use .safetensors (timm) '
                        'or .npz (released layout)')
  _SOURCE.check()
  from vit_jax.formats import npz, timm_layout  # pylint: disable=g-import-not-at-top
  if _SOURCE.params_file_only():
    params, spec, names = npz.load_npz(_SOURCE.checkpoint.value), None, None
  else:
    bundle = _SOURCE.resolve()
    params, spec, names = bundle.params, bundle.spec, bundle.class_names
  if out.endswith('.safetensors'):
    state = timm_layout.save_safetensors(out, params, spec=spec, class_names=names,
                                         drop_pre_logits=_DROP_PRE_LOGITS.value)
    print(f'wrote {out}: {len(state)} tensors in timm layout' +
          (f'; timm model: {timm_layout.timm_config(spec)}' if spec else ''))
  else:
    npz.save_npz(out, params)
    print(f'wrote {out}: released .npz layout')
  return 0


def main():
  flag_groups.adapt_model_source()
  flag_groups.adapt('out', help='Output file: .safetensors (timm) or .npz (released).')
  cli.run_main(run, required_flags=('out',))


if __name__ == '__main__':
  sys.exit(main())
