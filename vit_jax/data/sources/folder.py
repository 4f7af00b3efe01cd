"""'folder:PATH': a folder of class sub-folders of your own images, read in place
(vit_jax/data/folder.py lists, indexes and splits it)."""

from typing import Optional

from vit_jax.data import folder
from vit_jax.data.sources import in_place

PREFIX = folder.PREFIX


def load(dataset: str, data_dir: Optional[str]) -> in_place.InPlace:
  """The folder `dataset` names, listed again at each call so that a change is seen."""
  return in_place.InPlace(folder.load(dataset, data_dir))


__all__ = ['PREFIX', 'load']
