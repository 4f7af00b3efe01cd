"""The command-line commands, one thin module each: `python -m vit_jax <command> [flags]`.

Each module parses its flags and calls library functions; flags used by several commands are
defined once in flag_groups.py; cli.py (vit_jax/cli.py) runs a command (one `error:` line, exit 2,
for a user mistake). Importing this package defines no flags and imports nothing heavy.
"""

# name -> one line for `python -m vit_jax --help` (the module is vit_jax/commands/<name>.py).
COMMANDS = {
    'train': 'train or fine-tune a model from a config (also: python -m vit_jax.main)',
    'predict': 'top-k classes of image files with a trained or exported model',
    'export': 'write an inference bundle (params.npz + model.json) of a model',
    'convert': 'convert params between formats (timm .safetensors, released .npz)',
    'analyze': 'figures of what a trained ViT learned (filters, posemb, attention)',
    'fewshot': 'few-shot linear evaluation of a checkpoint',
    'evaluate': 'score a checkpoint on evaluators (k-NN, linear probe, ...): one results table',
    'sweep': 'run a hyperparameter sweep (grid, best setting, final runs, tables, plots)',
    'bench': 'time a train/infer step or the input pipeline (optionally against timm)',
    'launch': 'run one command on every worker of a Cloud TPU VM, or as a SLURM job',
    'weights': 'list (or --fetch) official pre-trained weights by name',
}

__all__ = ['COMMANDS']
