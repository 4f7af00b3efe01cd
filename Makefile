# The two quickstart commands: `make train` and `make test`. Both build .venv from nothing with the
# pinned versions in requirements.lock (tested on Python 3.11, CPU). `make test-interop` adds torch
# (CPU) and timm (requirements-interop.lock) and runs the parity tests in tests/interop.
# `make tpu-compiler` adds the TPU compiler (libtpu, requirements-tpu.lock) in .venv/tpu-compiler
# for `--config.compile_for=v3-8`; `make test` needs it (the suite compiles for TPU slices).
# `make test-fast` runs the tests not marked slow (no subprocesses or end-to-end runs).
# `make test-system` runs the system tier `make test` leaves out: a real SLURM, real full disks,
# kill loops (tests/conftest.py); .ci/run runs both.
# `make gpu-compiler` adds the XLA:GPU compiler in .venv/gpu-compiler for
# `--config.compile_for=h100` and `bench --compile_for=h100`; `make test` needs it too.
# `make install ACCEL=cuda13` (or cuda12) adds the CUDA build of the same jax
# (requirements-cuda13.lock) on a machine with an NVIDIA GPU; `make train ACCEL=cuda13` trains there.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default
PYTEST_ARGS ?=
INTEROP_STAMP := $(VENV)/.interop-installed
TPU_STAMP := $(VENV)/.tpu-compiler-installed
GPU_COMPILER_STAMP := $(VENV)/.gpu-compiler-installed
TORCH_WHEELS ?= /opt/wheels
# The accelerator build of JAX on top of requirements.lock: empty (CPU), cuda13 or cuda12.
ACCEL ?=
ACCELS := cuda13 cuda12
# ACCEL_CHECK=0 installs the CUDA build on a machine without an NVIDIA driver (an image build).
ACCEL_CHECK ?= 1
# --dist loadgroup: the tests of one `xdist_group` (the bad-input catalogue, which runs its cases
# as a pool of subprocesses) stay on one worker.
# Huge-page malloc for the test process (vit_jax/platform/hostmem.py; the commands restart with it themselves).
HUGEPAGE_MALLOC ?= glibc.malloc.hugetlb=1

.PHONY: install accel-check tpu-compiler gpu-compiler train test test-system test-fast test-interop clean

ifeq ($(ACCEL),)
install: $(STAMP)
else ifneq ($(filter $(ACCEL),$(ACCELS)),)
ACCEL_STAMP := $(VENV)/.$(ACCEL)-installed
install: $(ACCEL_STAMP)
else
install:
	@echo "error: unknown ACCEL=$(ACCEL): use ACCEL=cuda13 or ACCEL=cuda12 (NVIDIA GPUs), or no ACCEL for the CPU build" >&2; exit 2
endif

# The locks are installed by uv (its version pinned in requirements.lock, bootstrapped by pip):
# the same packages as `pip install --no-deps -r requirements.lock`. uv reads PyPI
# (or UV_INDEX_URL), not pip's configuration. Not byte-compiled at install: every command below
# writes the .pyc of what it imports on first import instead (`unexport` below: even where the
# environment sets PYTHONDONTWRITEBYTECODE).
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps
unexport PYTHONDONTWRITEBYTECODE

# pip bootstraps uv; uv installs the project too (editable, as a plain path entry: an import-hook
# editable install makes every interpreter start import more, and a Ctrl-C that lands while
# Python imports `site` ends in a fatal error). The venv gets no pip of its own when the machine's
# pip can install into it (`--python`, pip >= 22.3).
PIP = $$([ -x $(BIN)/pip ] && echo $(BIN)/pip || echo $(PYTHON) -m pip --python $(BIN)/python)
$(STAMP): requirements.lock setup.py
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python --version >/dev/null 2>&1 \
	  || $(BIN)/python -m ensurepip --default-pip >/dev/null
	$(PIP) install --quiet --no-deps "$$(grep -E '^uv==' requirements.lock)"
	$(UV) -r requirements.lock
	$(UV) --no-build-isolation -C editable_mode=compat -e .
	touch $(STAMP)

$(TPU_STAMP): $(STAMP) requirements-tpu.lock
	rm -rf $(VENV)/tpu-compiler
	$(UV) --require-hashes --target $(VENV)/tpu-compiler -r requirements-tpu.lock
	touch $(TPU_STAMP)

tpu-compiler: $(TPU_STAMP)

# The XLA:GPU compiler without the CUDA libraries, for `compile_for=h100` on any machine.
$(GPU_COMPILER_STAMP): $(STAMP) requirements-gpu-compiler.lock
	rm -rf $(VENV)/gpu-compiler
	$(UV) --require-hashes --target $(VENV)/gpu-compiler -r requirements-gpu-compiler.lock
	touch $(GPU_COMPILER_STAMP)

gpu-compiler: $(GPU_COMPILER_STAMP)

# The CUDA build: its PJRT plugin and the CUDA libraries, hash-pinned, into the same venv (the
# other CUDA build's plugin removed). Refused (one line) where no NVIDIA driver is loaded: there it
# would install gigabytes that cannot run.
$(VENV)/.cuda%-installed: requirements-cuda%.lock | accel-check $(STAMP)
	$(BIN)/uv pip uninstall --quiet --python $(BIN)/python jax-cuda12-plugin jax-cuda12-pjrt \
	  jax-cuda13-plugin jax-cuda13-pjrt
	$(UV) --require-hashes -r requirements-cuda$*.lock
	rm -f $(VENV)/.cuda*-installed
	touch $@

accel-check:
	@if [ "$(ACCEL_CHECK)" != 0 ] && [ ! -e /proc/driver/nvidia ] && ! command -v nvidia-smi >/dev/null; then \
	  echo "error: ACCEL=$(ACCEL) installs the CUDA build of JAX, but this machine has no NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia): run \`make install\` for the CPU build (ACCEL_CHECK=0 installs it anyway)" >&2; exit 2; fi

train: install
	$(BIN)/python -m vit_jax.main --config=configs/default.py --workdir=$(WORKDIR)

test: install $(TPU_STAMP) $(GPU_COMPILER_STAMP)
	GLIBC_TUNABLES=$(HUGEPAGE_MALLOC) $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=10 -m 'not system' tests --ignore=tests/interop $(PYTEST_ARGS)

# The system tier: a real SLURM, real full disks, kill loops (tests/conftest.py: SYSTEM_TESTS).
test-system: install $(TPU_STAMP) $(GPU_COMPILER_STAMP)
	GLIBC_TUNABLES=$(HUGEPAGE_MALLOC) $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=10 -m system tests --ignore=tests/interop $(PYTEST_ARGS)

# The fast tier: every test not marked `slow` (no subprocesses, no end-to-end runs).
test-fast: install $(TPU_STAMP) $(GPU_COMPILER_STAMP)
	GLIBC_TUNABLES=$(HUGEPAGE_MALLOC) $(BIN)/python -m pytest -q -n 2 --dist loadgroup -m 'not slow and not system' tests --ignore=tests/interop $(PYTEST_ARGS)

$(INTEROP_STAMP): $(STAMP) requirements-interop.lock
	$(PIP) install --quiet --no-deps --find-links $(TORCH_WHEELS) -r requirements-interop.lock
	touch $(INTEROP_STAMP)

test-interop: $(INTEROP_STAMP)
	$(BIN)/python -m pytest -q tests/interop $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
