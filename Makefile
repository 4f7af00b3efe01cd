# The two quickstart commands: `make train` and `make test`. Both build .venv from nothing with the
# pinned versions in requirements.lock (tested on Python 3.11, CPU).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default
PYTEST_ARGS ?=

.PHONY: install train test clean

install: $(STAMP)

$(STAMP): requirements.lock setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: install
	$(BIN)/python -m vit_jax.main --config=configs/default.py --workdir=$(WORKDIR)

test: install
	$(BIN)/python -m pytest -q -n 2 --durations=10 tests $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
