# Two entry points for a fresh machine (see README.md):
#   make quickstart   install torch and the launcher extra only, then prepare the builtin corpus and train 3 local ranks
#   make test         set up (including the apt packages the tests need), then lint and run every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps quickstart test lint

setup: $(VENV)/.installed

# torch is pinned to the CPU wheel this project is tested with. On PyPI that version is a CUDA
# build; elsewhere add TORCH_INDEX='--index-url https://download.pytorch.org/whl/cpu' for the CPU one.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

# Everything the tests need: the cloud SDKs, transformers, accelerate, Intel MPI, linters.
# --no-compile: Python compiles a module when it is first imported; compiling all of the cloud SDKs
# at install (~1 GB of source; Azure's alone took 32 s here) is time nothing uses.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile $(TORCH_INDEX) $(TORCH)
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m model.tokenizer install
	touch $@

# Only what the local cluster needs (the launcher extra): no cloud SDK, transformers or Intel MPI.
# A venv that already has dev is enough as it is.
$(VENV)/.installed-local: pyproject.toml
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then \
		echo "$(VENV) has the dev install: nothing to add for the quickstart"; \
	else \
		$(PYTHON) -m venv $(VENV) && \
		$(BIN)/pip install --quiet --upgrade pip && \
		$(BIN)/pip install --quiet --no-compile $(TORCH_INDEX) $(TORCH) && \
		$(BIN)/pip install --quiet --no-compile -e '.[launcher]' && \
		$(BIN)/python -m model.tokenizer install; \
	fi
	touch $@

# sshd and iproute2 for the test nodes (network namespaces); installed only when missing.
system-deps:
	@test -x /usr/sbin/sshd && command -v ip >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server iproute2 >/dev/null)

# The embedded default: the local cluster (3 ranks as processes on this machine), builtin corpus,
# launcher/quickstart.yaml (100 steps, a few minutes on 2 cores: README); data and runs in ~/nanocluster.
# The sample continues an English prompt (the builtin corpus is Python's documentation).
quickstart: $(VENV)/.installed-local
	$(BIN)/fab prepare-data
	$(BIN)/fab train --nodes 3
	$(BIN)/fab sample --prompt "The Python interpreter"

# ruff over everything; mypy over infra/ against the cloud SDKs' own types (pyproject [tool.mypy]).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# Every test but those marked `alone` spread over workers, a test file per worker (each builds its
# own test nodes, on its own subnet and ports); then the `alone` ones (bounds in seconds or Mbit/s:
# fail-fast times, link rates, step times) one at a time with nothing beside them. One worker more
# than cores: many tests wait on processes, polls and timeouts, so with one worker per core the 2
# cores here were busy 1.2 on average (CI: 29 CPU-min in 24.5 min).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: setup system-deps lint
	$(BIN)/pytest -m "not alone" -n $(TEST_WORKERS) --dist loadfile
	$(BIN)/pytest -m alone
