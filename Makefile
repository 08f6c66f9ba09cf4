# The two commands: `make serve` and `make test`. Both create .venv if missing and install the
# project with the CPU build of torch (pinned in the same pip command, see shared cpu-stack notes),
# the `ray` extra so the scale-out tests (tests/integration/cluster) run rather than skip, and the
# `fp8` extra (nvidia-modelopt) so the FP8 tests write ModelOpt's own checkpoint format. Every
# package is held to the exact version of requirements/lock.txt (pip constraints), the set the
# suite passed with; `make lock` is the one deliberate way to move it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
# The suite's 20 slowest tests close its log, so a CI run shows where its minutes went (the
# fault soak's own budget, 90 s, is read there: docs/operations.md).
SLOWEST := --durations=20
# The constraints every install honours; `make lock` installs with LOCK= (none) to resolve anew.
LOCK ?= requirements/lock.txt
CONSTRAINTS = $(if $(LOCK),-c $(LOCK))
EXTRAS ?= dev,ray,fp8
# The model-family equivalence tests that `make test-latest` runs on the newest libraries.
FAMILY_TESTS ?= tests/unit/models tests/unit/reasoner tests/unit/realtime tests/unit/sana_wm \
	tests/unit/cosmos3_world tests/unit/fp8
LATEST_VENV := .venv-latest
# What `make test-latest` lays over the locked set; `make test-latest LATEST_PINS=transformers==5.24.0`
# tries the oldest claimed release the same way.
LATEST_PINS ?= "transformers<6" "diffusers<1"
# BROWSER=0 leaves the browser tests (tests/e2e) out, explicitly; by default `make test` finds
# or installs Chromium (tests/e2e/ensure-chromium.sh) or stops with what to do. Under
# `make test` a test never skips for something the machine lacks (WORLDSERVE_TEST_STRICT=1).
BROWSER ?= 1

.PHONY: serve serve-qwen test mutations lint install dev-models clean lock test-latest wheelhouse

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found: install Python \
	3.11, or name one with make PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# pip's own progress (one line per package, a bar per download): the first install fetches
# about 1 GB (CPU torch, transformers, diffusers, Ray) into a 2 GB .venv, a few minutes.
$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	@echo "make: installing worldserve and its dependencies into $(VENV) (first time: about \
	1 GB to download, 2 GB on disk, a few minutes)"
	$(BIN)/pip install --progress-bar on $(CONSTRAINTS) torch==2.13.0 -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

dev-models: $(STAMP)
	$(BIN)/worldserve dev-models build

DEV_MODELS = $$($(BIN)/python -c 'from worldserve import envs; print(envs.dev_models_dir())')

# Images, videos, actions and live reasoning from the one Cosmos3 dev directory (generator +
# reasoner, as a published Cosmos3 checkpoint); the realtime stage serves the dev causal model.
# HOST= and PORT= pick the address (make serve PORT=8001).
serve: dev-models
	@echo "make: serving on http://$(HOST):$(PORT) (the stages load first: about 10-40 s)"
	$(BIN)/worldserve serve --host $(HOST) --port $(PORT)

# The same with the Qwen2.5-VL dev reasoner (`worldserve-dev-reasoner`) on the reasoner stage.
serve-qwen: dev-models
	$(BIN)/worldserve serve --host $(HOST) --port $(PORT) \
		--model-path "$(DEV_MODELS)/reasoner"

lint: $(STAMP)
	$(BIN)/ruff check worldserve tests benchmarks tools

# The mutation check (tests/mutations): each planted bug of tests/mutations/plants.py must make
# the tests that claim to cover it fail, on a temporary copy of the project. `make test` runs it
# after the suite; `make mutations` alone.
mutations: $(STAMP)
	WORLDSERVE_TEST_STRICT=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		$(BIN)/python -m pytest -q tests/mutations

ifeq ($(BROWSER),0)
test: $(STAMP) lint
	WORLDSERVE_TEST_STRICT=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
		$(BIN)/python -m pytest -q $(SLOWEST) --ignore=tests/e2e $(PYTEST_ARGS)
	$(MAKE) --no-print-directory mutations
else
test: $(STAMP) lint
	@chromium="$$(tests/e2e/ensure-chromium.sh)" && \
	echo "browser tests: $$chromium" && \
	WORLDSERVE_E2E_CHROMIUM="$$chromium" WORLDSERVE_TEST_STRICT=1 HF_HUB_OFFLINE=1 \
		TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q $(SLOWEST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory mutations
endif

# Move the lock: resolve the newest versions pyproject.toml allows into a fresh .venv-lock, run
# the whole suite (`make test`) on them, and only when it passes write requirements/lock.txt.
lock:
	rm -rf .venv-lock
	$(MAKE) --no-print-directory test VENV=.venv-lock LOCK=
	{ sed -n '/^#/p' requirements/lock.txt; \
	  .venv-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip=='; } > requirements/lock.new
	mv requirements/lock.new requirements/lock.txt
	@echo "make: requirements/lock.txt now holds the versions the suite passed with:"; \
	git diff --stat -- requirements/lock.txt || true

# The next upstream change found by a test, not a user: the locked set with the newest releases
# of transformers (< 6) and diffusers (< 1) over it, beyond pyproject.toml's tested range, in
# .venv-latest; then the model-family equivalence tests. Its last result is in README.md
# (tested versions); when it passes, widen the range in pyproject.toml and run `make lock`.
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install -q $(CONSTRAINTS) torch==2.13.0 -e ".[dev,fp8]"
	$(LATEST_VENV)/bin/pip install -q --upgrade $(LATEST_PINS)
	$(LATEST_VENV)/bin/pip list 2>/dev/null | grep -E '^(transformers|diffusers|tokenizers|huggingface)'
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WORLDSERVE_TEST_STRICT=1 \
		$(LATEST_VENV)/bin/python -m pytest -q $(FAMILY_TESTS) $(PYTEST_ARGS)

# An offline install for a GPU host that has its own CUDA torch and no network (docs/hardware.md):
# every package of the lock except torch and the CUDA runtime wheels (tools/wheelhouse.py), as
# wheels for CPython $(PY) on x86_64 Linux, into $(WHEELHOUSE)/; only the lock's pins, no
# resolving (--no-deps: the lock is complete). manylinux wheels for glibc <= 2.$(GLIBC_MINOR)
# (llguidance 1.9's need 2.31); pip takes each --platform tag literally, so every older one is
# listed too.
PY ?= 3.11
GLIBC_MINOR ?= 31
WHEEL_PLATFORMS ?= $(foreach minor,$(shell seq $(GLIBC_MINOR) -1 5),manylinux_2_$(minor)_x86_64) \
	manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64
WHEELHOUSE ?= wheelhouse
wheelhouse: $(BIN)/python
	mkdir -p $(WHEELHOUSE)
	$(BIN)/python -m tools.wheelhouse $(or $(LOCK),requirements/lock.txt) > $(WHEELHOUSE)/requirements.txt
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version $(PY) \
		--implementation cp --abi cp$(subst .,,$(PY)) $(addprefix --platform ,$(WHEEL_PLATFORMS)) \
		-r $(WHEELHOUSE)/requirements.txt -d $(WHEELHOUSE)
	@echo "make: $(WHEELHOUSE)/ holds $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels, \
	$$(du -sh $(WHEELHOUSE) | cut -f1); copy it with the checkout to the GPU host and run there: \
	pip install --no-index --find-links $(WHEELHOUSE) -e ."

clean:
	rm -rf $(VENV) .venv-lock $(LATEST_VENV) outputs .pytest_cache
