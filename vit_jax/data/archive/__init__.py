"""The guarded release reader: where every image of an image archive or folder is, so that it
streams without a copy, and its bytes read back only as indexed.

  layouts.py   the six layouts of a source, its units, and what of each is read
  indexing.py  one unit -> one part file of the index
  building.py  the parts built in parallel (workers, signals, progress), merged into one index
  reading.py   the index loaded; each image's bytes read in place, checked
  store.py     where indexes are stored

The names below are the package's interface; each lives in the module named above.
"""

from vit_jax.data.archive.building import FORMAT, build
from vit_jax.data.archive.layouts import (IMAGE_EXTENSIONS, LAYOUTS, NOTE_KINDS, Unit, fingerprint,
                                          list_units)
from vit_jax.data.archive.reading import Index, ReadError, load
from vit_jax.data.archive.store import (DIR_VAR, folder_index_base, index_base, index_dir,
                                        read_json, write_failure, write_file,
                                        write_json)
from vit_jax.data.archive.indexing import CHECKSUM

__all__ = ['CHECKSUM', 'DIR_VAR', 'FORMAT', 'IMAGE_EXTENSIONS', 'Index', 'LAYOUTS', 'NOTE_KINDS',
           'ReadError', 'Unit', 'build', 'fingerprint', 'folder_index_base', 'index_base',
           'index_dir', 'list_units', 'load', 'read_json', 'write_failure', 'write_file',
           'write_json']
