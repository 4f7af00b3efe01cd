#!/usr/bin/env bash
# The GPU run: one call of a few minutes on a machine with an NVIDIA GPU (H100, H200), its own
# JAX (CUDA build), torch and timm, no network, and the wheels of benchmarks/gpu_wheels.sh in .whl/:
#   OUT=/some/dir bash benchmarks/gpu_session.sh
# Steps, in this order; each run is bounded by $RUN_TIMEOUT seconds (--suite_timeout; the curve
# by $CURVE_TIMEOUT), and a step starts only if it ends by $DEADLINE seconds even when every run
# in it takes its whole bound (so the results come back from a call of 600 s at most); no step
# stops the ones after it:
#  1. the stack: nvidia-smi, and the versions of jax, jaxlib, the CUDA plugin, flax, torch, timm;
#  2. ViT-B/16 batch 256 training: ours (cuDNN attention, bf16), ours with fp8 dense layers
#     (`model.fp8`), timm compiled; each timed and profiled: the suite's table and the table of
#     ms per step by kernel class, ours against timm (`bench --suite=gpu --suite_profile`);
#  3. fp8's loss curve against bf16's: configs/default.py for $CURVE_STEPS steps, the same seeds
#     (benchmarks/fp8_curve.py);
#  4. ViT-B/16 batch 256 inference: ours (cuDNN) against timm compiled;
#  5. ViT-L/16 batch 128 training: ours bf16, ours fp8, timm compiled;
#  6. the ViT-B/16 train run under each XLA:GPU flag variant of $VARIANTS (vit_jax/platform/gpu.py).
# Into $OUT (at most 8 files): log.txt (everything printed, the tables included), the suite
# rows of steps 2, 4, 5 and 6 as bench writes them (train.json, infer.json, large_train.json,
# xla_variants.json) and the curves (fp8_curve.jsonl).
# SUITE=smoke runs the same steps on a CPU in minutes (ViT-Ze/4 at 28 px, fp8 emulated by
# XLA:CPU, timm eager where torch is installed): the script's own test. TRAIN, INFER, LARGE (run
# ids, comma-separated; empty skips the step), CURVE_STEPS (0 skips the curve) and VARIANTS
# change what it runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-570}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
CURVE_TIMEOUT=${CURVE_TIMEOUT:-150}
SUITE=${SUITE:-gpu}
if [ "$SUITE" = gpu ]; then
  TRAIN=${TRAIN-B/16-train-ours-cudnn,B/16-train-ours-cudnn+fp8,B/16-train-timm-compiled}
  INFER=${INFER-B/16-infer-ours-cudnn,B/16-infer-timm-compiled}
  LARGE=${LARGE-L/16-train-ours-cudnn,L/16-train-ours-cudnn+fp8,L/16-train-timm-compiled}
  VARIANT_RUN=B/16-train-ours-einsum
  VARIANTS=${VARIANTS-latency_hiding no_triton_gemm no_command_buffers}
  CURVE_STEPS=${CURVE_STEPS:-600}
  CURVE=(--config="configs/default.py:steps=$CURVE_STEPS" --config.log_every=20
         --config.eval_every="$CURVE_STEPS" --config.checkpoint_every="$CURVE_STEPS")
  if [ ! -e /proc/driver/nvidia ] && ! command -v nvidia-smi >/dev/null; then
    echo "error: benchmarks/gpu_session.sh runs on a machine with an NVIDIA GPU and this one has none (no nvidia-smi, no /proc/driver/nvidia): SUITE=smoke runs its steps here" >&2
    exit 2
  fi
elif [ "$SUITE" = smoke ]; then
  TRAIN=${TRAIN-Ze/4-train-ours-einsum,Ze/4-train-ours-einsum+fp8,Ze/4-train-timm-eager}
  INFER=${INFER-Ze/4-infer-ours-einsum,Ze/4-infer-timm-eager}
  LARGE=${LARGE-}
  VARIANT_RUN=Ze/4-train-ours-einsum
  VARIANTS=${VARIANTS-}
  CURVE_STEPS=${CURVE_STEPS:-20}
  CURVE=(--config="configs/default.py:model_name=ViT-Ze/4,steps=$CURVE_STEPS"
         --config.warmup_steps=2 --config.log_every=5 --config.eval_every="$CURVE_STEPS"
         --config.checkpoint_every="$CURVE_STEPS")
  export VIT_JAX_FP8_EMULATION_FOR_TESTS=1  # fp8 on the CPU: its numerics, not its speed
  # timm imports torchvision, which has no CPU build for every torch: the tests' stand-in.
  "${PYTHON:-python3}" -c 'import torchvision' 2>/dev/null || STUBS=tests/interop/stubs
else
  echo "error: unknown SUITE=$SUITE: use SUITE=gpu (the default) or SUITE=smoke" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD${STUBS:+:$PWD/$STUBS}${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 \
  PYTHONUNBUFFERED=1

main() {
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

# step SECONDS NAME: true (and says so) if a step that takes at most SECONDS ends by $DEADLINE.
step() {
  if [ $((SECONDS + $1)) -gt "$DEADLINE" ]; then
    echo "== skipped $2 (at $SECONDS s it could end after DEADLINE=$DEADLINE s)"
    return 1
  fi
  echo "== $2 ($SECONDS s)"
}

# runs IDS: how many runs a comma-separated list of run ids holds.
runs() {
  local ids=${1//[^,]/}
  echo $(( ${#ids} + 1 ))
}

# suite FILE IDS [FLAGS...]: the suite's runs IDS into $OUT/FILE, the tables into the log.
suite() {
  local file=$1 ids=$2
  shift 2
  "$PY" -m vit_jax bench --suite="$SUITE" --compare=timm --suite_only="$ids" \
    --suite_timeout="$RUN_TIMEOUT" --json "$@" > "$OUT/$file"
}

step 60 "the stack" && {
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PY" - <<'PY'
from vit_jax.tools.benchmarking import compare
import jax
print('versions:', compare.versions())
print('devices:', jax.devices())
for name in ('torch', 'timm'):
  try:
    print(name, __import__(name).__version__)
  except ImportError as e:
    print(name, 'not importable:', e)
PY
}
[ -n "$TRAIN" ] && step $(($(runs "$TRAIN") * RUN_TIMEOUT)) "train, timed and profiled: $TRAIN" &&
  suite train.json "$TRAIN" --suite_profile
[ "$CURVE_STEPS" -gt 0 ] && step "$CURVE_TIMEOUT" "fp8's loss curve against bf16's" &&
  timeout "$CURVE_TIMEOUT" "$PY" benchmarks/fp8_curve.py "${CURVE[@]}" --workdir="$(mktemp -d)" \
    --json="$OUT/fp8_curve.jsonl"
[ -n "$INFER" ] && step $(($(runs "$INFER") * RUN_TIMEOUT)) "inference: $INFER" &&
  suite infer.json "$INFER"
[ -n "$LARGE" ] && step $(($(runs "$LARGE") * RUN_TIMEOUT)) "train, larger: $LARGE" &&
  suite large_train.json "$LARGE"
if [ -n "$VARIANTS" ]; then
  ids=$(for v in $VARIANTS; do printf '%s+xla:%s,' "$VARIANT_RUN" "$v"; done)
  ids=${ids%,}
  step $(($(runs "$ids") * RUN_TIMEOUT)) "XLA:GPU flag variants: $VARIANTS" &&
    suite xla_variants.json "$ids" --suite_xla="$(echo $VARIANTS | tr ' ' ,)"
fi
echo "== done ($SECONDS s)"
}

main 2>&1 | tee "$OUT/log.txt"
