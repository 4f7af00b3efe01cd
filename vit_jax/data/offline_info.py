"""`OfflineDatasetInfo`: the DatasetInfo of the datasets this project builds itself, offline.

tfds (4.9.10) asks a builder whose directory holds no `dataset_info.json` yet, i.e. every builder
made before or during its first preparation, for metadata "from the GCS bucket": it makes a
directory with `tempfile.mkdtemp('tfds')` first and returns without removing it when GCS is off
(its default) or has nothing, so each first preparation would leave an empty `/tmp/tmp*tfds`
behind. The embedded datasets and image folders are never on GCS: their info starts from the
code, and nothing is made in the temporary directory.
tfds's own builders do the same when their dataset directory exists but holds no info yet (a
download that never finished, a version not prepared): `no_leftover_temp_dirs` removes the empty
directories a call of theirs left.
"""

import contextlib
import glob
import os
import tempfile

import tensorflow_datasets as tfds


class OfflineDatasetInfo(tfds.core.DatasetInfo):
  """A tfds DatasetInfo that never looks for (or makes room for) metadata on GCS."""

  def initialize_from_bucket(self) -> None:
    """No metadata of these datasets is published: the code's info is the info."""


def _tfds_temp_dirs() -> set:
  return set(glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), 'tmp*tfds')))


@contextlib.contextmanager
def no_leftover_temp_dirs():
  """Removes the `tmp*tfds` directories that appeared in the temporary directory during the block
  and are still empty when it ends (tfds's unused room for GCS metadata); a non-empty one, and
  anything else, stays."""
  before = _tfds_temp_dirs()
  try:
    yield
  finally:
    for path in _tfds_temp_dirs() - before:
      try:
        os.rmdir(path)  # only an empty directory goes
      except OSError:
        pass
