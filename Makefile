# Two commands do everything on a fresh machine:
#   make run    set up .venv and train on Super Mario Bros 1-1 (flywheel run; ARGS="--env CartPole-v1" etc.)
#   make test   set up .venv (and missing Debian packages), run ruff, mypy and the whole test suite (what CI runs)
#   make test-fast  set up .venv, run the fast tier: no process started, no Debian package needed (a few minutes)
#   make bench SUITE=replay   install the peers and run one `flywheel bench` suite
#   make wheel  build dist/flywheel_rl-*.whl, what `pip install` from a clone or a git URL installs
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# where torch comes from, e.g. https://download.pytorch.org/whl/cu128 for a CUDA 12.8 build or .../whl/cpu for the
# CPU one (empty: the package index pip is configured with)
TORCH_INDEX ?=
ARGS ?=
# pytest-xdist workers for make test and test-fast: 0 runs every test in pytest's own process, N in N worker
# processes, each test file on one worker (--dist loadfile: a module's shared fixture starts once), the files in the
# order tests/conftest.py gives them, the longest first (xdist's own order puts the files with most tests first,
# which left the one-test compose and install files to run alone at the end). 2 on a 2-core machine, though the cores
# idle a fifth of the time while system tests wait: 3 workers took a clean clone's make test from 1,238 s to 1,074 s
# once (2026-12-05), but at a load average of 14-17 tests that time CPU seconds or train for a fixed 24 s failed
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
# the venv's packages are installed by uv (pip-compatible, installs in parallel: a fresh .venv with the dev tools
# in about 50 s, where pip took about 120 s); pip stays in the venv for what uses it (make wheel, the tests). uv
# reads no pip.conf: pip's find-links from the environment are passed on (where this machine keeps torch's wheel).
# --compile-bytecode, as pip does by default: without .pyc files (and with PYTHONDONTWRITEBYTECODE=1, as on this
# machine) every process compiles torch's modules again at import, which made make test's pytest 34% slower
UV_INSTALL := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python
comma := ,
space := $(subst ,, )
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(subst $(space),$(comma),$(strip $(PIP_FIND_LINKS)))
endif
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup dev-setup system-deps run test test-fast lint bench bench-setup wheel clean

# what running needs: torch, then flywheel with every env family and feature (the `all` extra); the dev tools
# (pytest, linters, deploy validators) are installed by `make test` only, in the same pip run as the rest
$(VENV)/.torch-installed:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(UV_INSTALL) "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	@touch $@

$(BIN)/flywheel: pyproject.toml $(VENV)/.torch-installed
	$(UV_INSTALL) --upgrade-package pip pip -e '.[all]'
	@touch $@

$(VENV)/.dev-installed: pyproject.toml $(VENV)/.torch-installed
	$(UV_INSTALL) --upgrade-package pip pip -e '.[all,dev]'
	@touch $(BIN)/flywheel $@

setup: $(BIN)/flywheel

dev-setup: $(VENV)/.dev-installed

run: setup
	$(BIN)/flywheel run $(ARGS)

system-deps:
	.ci/install-debian-packages

bench-setup: dev-setup
	$(UV_INSTALL) -e '.[dev,bench]'

bench: bench-setup
	$(BIN)/flywheel bench $(SUITE) $(ARGS)

lint: dev-setup
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py
	$(BIN)/python scripts/import_cycles.py

# the whole suite, every tier; the 25 slowest tests are listed at the end. The Debian packages and the venv are
# set up side by side, and mypy runs beside pytest (its report is printed after pytest's; either failing fails)
test:
	$(MAKE) --no-print-directory -j2 system-deps dev-setup
	$(BIN)/ruff check .
	$(BIN)/python scripts/import_cycles.py
	@$(BIN)/python scripts/typecheck.py > $(VENV)/typecheck.log 2>&1 & typecheck=$$!; \
	$(PYTEST) --durations=25; tests=$$?; \
	wait $$typecheck; typed=$$?; echo "== mypy (scripts/typecheck.py, run beside pytest) =="; \
	cat $(VENV)/typecheck.log; test $$tests -eq 0 -a $$typed -eq 0

# the tests marked neither system nor slow (tests/conftest.py, CONTRIBUTING.md)
test-fast: dev-setup
	$(PYTEST) -m "not system and not slow"

# the venv's setuptools builds it (no build isolation: no package index needed); tests/test_wheel.py installs one
# outside the checkout and runs flywheel from it
wheel: setup
	$(BIN)/pip wheel --no-deps --no-build-isolation --quiet -w dist .
	@ls dist/flywheel_rl-*.whl

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
