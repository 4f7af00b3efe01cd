#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU, its own JAX (CUDA build), torch and
# timm, and the wheels of benchmarks/gpu_wheels.sh in .whl/:
#   OUT=/some/dir bash benchmarks/gpu_check.sh
# 1. installs the wheels of .whl/ whose module this Python cannot import (nothing else);
# 2. prints nvidia-smi and JAX's devices;
# 3. runs the GPU suite's core runs (ours against timm compiled: ViT-B/16 train and inference,
#    ViT-L/16 train) with --json into $OUT/suite.json (table in $OUT/suite.log), our train runs
#    dumping their compiled train step (buffer assignment, memory-usage report, optimised HLO),
#    kept as ONE file, $OUT/train_step_dumps.tar.gz;
# 4. while the elapsed time is under $BUDGET seconds, one more ViT-B/16 train run per XLA:GPU
#    flag variant (vit_jax/platform/gpu.py) into $OUT/xla_<variant>.json, then the $EXTRA runs
#    (remat=dots: the compiled peak against the speed) into $OUT/extra_<id>.json.
# No step stops the ones after it; each run has its own time limit (--suite_timeout).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-300}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
VARIANTS=${VARIANTS-latency_hiding no_triton_gemm no_command_buffers}
# Extra runs while the budget lasts, after the XLA variants: remat=dots (memory against speed).
EXTRA=${EXTRA-B/16-train-ours-cudnn:dots,B/16-train-ours-einsum:dots}
SUITE=${SUITE:-gpu}  # SUITE=smoke with a CORE of its run ids tries this script on a CPU
VARIANT_RUN=${VARIANT_RUN:-B/16-train-ours-einsum}
CORE=${CORE:-B/16-train-ours-einsum,B/16-train-ours-cudnn,B/16-train-timm-compiled,B/16-infer-ours-einsum,B/16-infer-timm-compiled,L/16-train-ours-einsum,L/16-train-timm-compiled}
if [ "$SUITE" = gpu ] && [ ! -e /proc/driver/nvidia ] && ! command -v nvidia-smi >/dev/null; then
  echo "error: benchmarks/gpu_check.sh runs on a machine with an NVIDIA GPU and this one has none (no nvidia-smi, no /proc/driver/nvidia): run \`python -m vit_jax bench --suite=smoke\` to try the suite here" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
DUMPS=$(mktemp -d)

echo "== wheels"
missing=()
if [ -f .whl/MANIFEST ]; then
  while read -r module file; do
    "$PY" -c "import $module" 2>/dev/null || missing+=(".whl/$file")
  done < .whl/MANIFEST
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  "$PY" -m pip install --quiet --no-deps --no-index "${missing[@]}" 2>/dev/null \
    || "$PY" -m pip install --quiet --no-deps --no-index --break-system-packages "${missing[@]}"
fi

echo "== devices ($SECONDS s)"
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
"$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -1

echo "== suite ($SECONDS s)"
"$PY" -m vit_jax bench --suite="$SUITE" --compare=timm --suite_only="$CORE" \
  --suite_timeout="$RUN_TIMEOUT" --suite_dump="$DUMPS" --json \
  > "$OUT/suite.json" 2> >(tee "$OUT/suite.log" >&2)
wait

echo "== train step dumps ($SECONDS s)"
(cd "$DUMPS" && find . -name "*${TRAIN_STEP_MODULE:-jit_wrapped}*" \
   \( -name '*buffer-assignment.txt' -o -name '*memory-usage-report.txt' \
      -o -name '*after_optimizations.txt' \) -print0 \
 | tar czf "$OUT/train_step_dumps.tar.gz" --null -T -)
tar tzf "$OUT/train_step_dumps.tar.gz"

for variant in $VARIANTS; do
  if [ "$SECONDS" -ge "$BUDGET" ]; then
    echo "== skipped xla:$variant ($SECONDS s >= BUDGET=$BUDGET)"
    continue
  fi
  echo "== xla:$variant ($SECONDS s)"
  "$PY" -m vit_jax bench --suite="$SUITE" --suite_only="$VARIANT_RUN+xla:$variant" \
    --suite_xla="$variant" --suite_timeout="$RUN_TIMEOUT" --json > "$OUT/xla_$variant.json"
done
for id in ${EXTRA//,/ }; do
  if [ "$SECONDS" -ge "$BUDGET" ]; then
    echo "== skipped $id ($SECONDS s >= BUDGET=$BUDGET)"
    continue
  fi
  echo "== $id ($SECONDS s)"
  "$PY" -m vit_jax bench --suite="$SUITE" --suite_only="$id" --suite_timeout="$RUN_TIMEOUT" \
    --json > "$OUT/extra_${id//[\/:]/_}.json"
done
rm -rf "$DUMPS"
echo "== done ($SECONDS s)"
