"""VTAB-1k: the 19 fine-tunes of one pre-trained model with the paper's recipe (2,500 steps at lr
0.01, 384 px; ViT paper, Appendix B.1.1), each task trained on its train800val200 split and tested
on its test split (docs/data.md, VTAB-1k). Set INIT (the pre-trained model: a workdir, an official
.npz, or weights by name) and DATA_DIR (where the tasks' tfds datasets are prepared) below, then:

python -m vit_jax sweep --sweep=experiments/vtab/sweep.py --workdir=runs/experiments/vtab

results.md and the printed table end with the VTAB table: each task's top-1 by group, the
natural, specialized and structured means and the mean over the 19, the paper's VTAB columns
(`vtab.table`, the table `python -m vit_jax evaluate --evals=vtab` writes too, which runs the
same fine-tunes of one checkpoint in one command; the sweep shares them between machines with
--storage).
"""

from vit_jax.data.sources import vtab

INIT = 'ViT-B/16@imagenet21k'
DATA_DIR = None  # tfds's default, ~/tensorflow_datasets


def get_sweep():
  overrides = {'init': INIT, 'progress': False}
  if DATA_DIR:
    overrides['data_dir'] = DATA_DIR
  return {
      'config': 'configs/finetune.py:model=B/16,dataset=vtab/caltech101',
      'overrides': overrides,
      'grid': {'dataset': [vtab.PREFIX + task for task in vtab.TASKS]},
      'metric': 'accuracy',
      'summary': lambda rows: vtab.table(vtab.from_rows(rows)),
  }
