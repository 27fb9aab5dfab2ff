# Two entry points for a fresh machine (see README.md):
#   make quickstart   install torch and the launcher extra only, then prepare the builtin corpus and train local ranks
#   make test         set up (including the apt packages the tests need), then lint and run every test
PYTHON ?= python3
# Python keeps the bytecode of what it imports, whatever the calling environment says: container images
# often set PYTHONDONTWRITEBYTECODE, and with it (and pip's --no-compile below) every trainer, launcher
# and test process compiled torch and the cloud SDKs from source again (`import model.train`: 7.5-10
# CPU-s instead of 3; the test suite is CPU-bound).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup system-deps quickstart test lint lock lock-upgrade

setup: $(VENV)/.installed

# Every install takes its versions from requirements.lock (pip -c): development, CI and the nodes
# (node/requirements-*.txt, written from the same lock) run the same releases. The lock pins the
# CPU build of torch (2.13.0+cpu): where pip's configuration does not find it, add
# TORCH_INDEX='--index-url https://download.pytorch.org/whl/cpu'.
LOCK := requirements.lock
TORCH_INDEX ?=
# --no-compile: Python compiles a module when it is first imported (and keeps it: see the unexport
# above); compiling all of the cloud SDKs at install (~1 GB of source; Azure's alone took 32 s here)
# is time nothing uses.
PIP_INSTALL := $(BIN)/pip install --quiet --no-compile --constraint $(LOCK)

# The locked pip and setuptools first: the project is built with the locked setuptools
# (--no-build-isolation), not whichever release is newest that day.
# The editable install maps the wheel's names (nanocluster.model, ...: setup.py); the .pth puts this
# checkout on the venv's path too, so its packages import by their own names (model, launcher) from
# any directory, as the tests' subprocesses and bench/ import them.
install_locked = $(PYTHON) -m venv $(VENV) \
	&& $(PIP_INSTALL) pip setuptools \
	&& $(PIP_INSTALL) $(TORCH_INDEX) torch \
	&& $(PIP_INSTALL) --no-build-isolation -e '.[$(1)]' \
	&& echo '$(CURDIR)' > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nanocluster-checkout.pth"

# Everything the tests need: the cloud SDKs, transformers, accelerate, Intel MPI, linters; and the GPT-2
# vocabulary, which model.tokenizer otherwise fetches on first use, as the tests must not need the network.
$(VENV)/.installed: pyproject.toml setup.py $(LOCK)
	$(call install_locked,dev)
	$(BIN)/python -m model.tokenizer install
	touch $@

# Only what the local cluster needs (the launcher extra): no cloud SDK, transformers or Intel MPI.
# A venv that already has dev is enough as it is.
$(VENV)/.installed-local: pyproject.toml setup.py $(LOCK)
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt $(LOCK) ] && [ $(VENV)/.installed -nt pyproject.toml ] \
		&& [ $(VENV)/.installed -nt setup.py ]; then \
		echo "$(VENV) has the dev install: nothing to add for the quickstart"; \
	else \
		$(call install_locked,launcher); \
	fi
	touch $@

# After changing pyproject.toml's dependencies or requirements.in: resolve the lock again, keeping
# every version that still fits, and write the nodes' pins from it. lock-upgrade takes the newest
# releases the ranges allow (then run make test). Both need the package index.
lock: setup
	$(BIN)/python -m tools.lock update
lock-upgrade: setup
	$(BIN)/python -m tools.lock update --upgrade

# sshd and iproute2 for the test nodes (network namespaces); installed only when missing.
system-deps:
	@test -x /usr/sbin/sshd && command -v ip >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server iproute2 >/dev/null)

# The embedded default: the local cluster (ranks as processes on this machine: one per core, at most 3;
# one per GPU on a machine with GPUs, which refuses more ranks than GPUs), builtin corpus,
# launcher/quickstart.yaml (300 steps, a few minutes on 2 cores: README); data and runs in ~/nanocluster.
# The sample continues an English prompt (the builtin corpus is Python's documentation).
quickstart: $(VENV)/.installed-local
	$(BIN)/fab prepare-data
	$(BIN)/fab train
	$(BIN)/fab sample --prompt "The Python interpreter"

# ruff over everything (its checks, lines of at most 120 characters, and its formatter: `.venv/bin/ruff format .`
# writes what --check asks for); mypy over every package with untyped definitions disallowed, infra/ against
# the cloud SDKs' own types (pyproject [tool.mypy]); the import layering (.importlinter); the nodes' pins
# against the lock; docs/ built as a site (mkdocs.yml, strict: a broken link or anchor fails), offline, into
# the ignored .venv/site. Its output is shown only when it fails: mkdocs 1.6's --quiet would also stop strict
# mode from counting warnings, so the build passes with broken links.
# NO_MKDOCS_2_WARNING silences Material's notice about MkDocs 2.0 (Material's documented switch).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m tools.lock check
	@out=$$(NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site 2>&1) \
		|| { echo "$$out"; echo "mkdocs build --strict failed"; exit 1; }

# Every test but those marked `alone` spread over workers, a test file per worker (each builds its
# own test nodes, on its own subnet and ports); then the `alone` ones (bounds in seconds or Mbit/s:
# fail-fast times, link rates, step times) one at a time with nothing beside them. One worker more
# than cores: many tests wait on processes, polls and timeouts, so with one worker per core the 2
# cores here were busy 1.2 on average (CI: 29 CPU-min in 24.5 min).
#
# Both runs in a random order (pytest-randomly: the files, the tests in each file), so a test that
# passes only after another fails here, not on the day the order changes. The seed is drawn once and
# printed at the top of each run ("Using --randomly-seed=N"); `make test TEST_SEED=N` replays it.
# --dist loadfile still hands each worker whole files. --durations: the slowest tests, printed at the end
# of each run, so the CI log says where its minutes went.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
ifndef TEST_SEED
TEST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
TEST_ORDER := -p randomly --randomly-seed=$(TEST_SEED)
test: setup system-deps lint
	$(BIN)/pytest $(TEST_ORDER) -m "not alone" -n $(TEST_WORKERS) --dist loadfile --durations=30
	$(BIN)/pytest $(TEST_ORDER) -m alone --durations=10
