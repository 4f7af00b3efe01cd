"""The preprocessing a config asks for: the one place that reads `config.pp` and `config.randaug`.

`train_pp(config)` gives the keys of `specs.TrainSpec`, `eval_pp(config)` those of
`specs.EvalSpec`; training, bundles, the analyses and few-shot evaluation all call these.
"""


def train_pp(config) -> dict:
  """The train preprocessing of a config (keys of `data.specs.TrainSpec`)."""
  return dict(crop=config.pp.train_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, pad=config.pp.pad,
              flip=config.pp.flip, channels=config.pp.channels,
              randaug_layers=config.randaug.num_layers,
              randaug_magnitude=config.randaug.magnitude)


def eval_pp(config) -> dict:
  """The eval preprocessing of a config (keys of `data.specs.EvalSpec`)."""
  return dict(crop=config.pp.eval_crop, image_size=config.image_size,
              resize=config.pp.resize or config.image_size, channels=config.pp.channels)


__all__ = ['eval_pp', 'train_pp']
