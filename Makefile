# Two commands do everything on a fresh machine:
#   make run    set up .venv and train on Super Mario Bros 1-1 (flywheel run; ARGS="--env CartPole-v1" etc.)
#   make test   set up .venv, run ruff and the whole test suite
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=
BIN := $(VENV)/bin

.PHONY: setup run test lint clean

$(BIN)/flywheel: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

setup: $(BIN)/flywheel

run: setup
	$(BIN)/flywheel run $(ARGS)

lint: setup
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
