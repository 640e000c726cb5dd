# slotserve: every target sets up what it needs on a fresh machine (Python 3.11, make, git; node for interop).
#   make run    serve the demo model repository on 127.0.0.1:8001 (ARGS="--parallel-jobs 2 ..." adds flags)
#   make test   lint (make lint), then run the whole test suite
#   make test-fast  the inner loop: the unit, contract and docs suites (a few minutes on two cores)
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TRT_API_CU12 := $(VENV)/trt-api-cu12
HOST ?= 127.0.0.1
PORT ?= 8001
# The demo repository is the only one the Makefile builds or deletes; REPOSITORY (what `make run` serves) may be
# any folder, served as it is: nothing here writes into it or removes it.
DEMO_REPOSITORY := demo/model_repository
REPOSITORY ?= $(DEMO_REPOSITORY)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: help setup setup-runtime setup-dev lint proto models run test test-fast contract stress docs node-deps bench soak gpu-check lock clean mutate

help:
	@echo "make run      serve the demo models on $(HOST):$(PORT) (HOST=, PORT=, REPOSITORY=, ARGS= change it)"
	@echo "make test     set everything up, run make lint, then the whole test suite"
	@echo "make test-fast  the unit, contract and docs suites only (a few minutes on 2 cores; tests/README.md)"
	@echo "make lint     ruff (lint and format check) and mypy (pyproject.toml configures them)"
	@echo "make contract list every contract cell's state, then 'contract: covered N, improved N, not applicable N, ...'"
	@echo "make stress   contract, shutdown, integration and admission tests STRESS_RUNS times (default 5) beside"
	@echo "              a CPU hog per core, with a 1 us GIL switch interval in every Python process (flaky = bug)"
	@echo "make docs     rewrite the generated parts of docs/ (flag tables, behaviour cells); a test fails when stale"
	@echo "make proto    regenerate generated/ from proto/"
	@echo "make models   build the demo model repository into $(DEMO_REPOSITORY)"
	@echo "make bench    measure speed against a bare grpcio server (prints a table, writes bench/results/)"
	@echo "make soak     mixed traffic, faults and reloads for SOAK_SECONDS (default 300), then an audit"
	@echo "make mutate   plant one bug at a time in the core and run its tests: kill rate per module, survivors"
	@echo "make gpu-check  on an NVIDIA GPU machine: install the TensorRT extra the driver runs, build, compare with ONNX Runtime, time slots"

# Two sets in one venv: what serving needs (requirements.txt; `make run`), and on top of it the test, lint and
# TensorRT API tools (requirements-dev.txt; `make test`). Either order works on a fresh clone.
setup: setup-runtime setup-dev
setup-runtime: $(VENV)/.editable
setup-dev: $(VENV)/.editable $(VENV)/.dev $(TRT_API_CU12)/.stamp

# Each step says what it installs before pip starts (--quiet keeps pip's own lines out, and a first install of the
# runtime takes minutes: grpcio, onnxruntime, numpy).
$(VENV)/.runtime: requirements.txt constraints.txt
	@echo "make: creating the virtual environment $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "make: installing the runtime requirements (requirements.txt: grpcio, onnxruntime, numpy, ...) into $(VENV); the first time takes a few minutes"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	@echo "make: installing the test, lint and TensorRT API tools (requirements-dev.txt) into $(VENV)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	@echo "make: installing the TensorRT type stubs (tensorrt-stubs) into $(VENV)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps tensorrt-stubs==10.13.0.35.1
	touch $@

# The other TensorRT/CUDA API generation for tests/tensorrt/test_api_conformance.py: TensorRT 10 (CUDA 12) and
# cuda-bindings 12 install without a GPU too, but under the module names of the venv's TensorRT 11 / cuda-bindings
# 13, so they go into a folder of their own that the test imports in a subprocess (about 50 MB, downloaded once).
$(TRT_API_CU12)/.stamp: tests/tensorrt/api-generation-cu12.txt $(VENV)/.dev
	rm -rf $(TRT_API_CU12)
	@echo "make: installing the TensorRT 10 / CUDA 12 API modules (about 50 MB) into $(TRT_API_CU12)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --target $(TRT_API_CU12) -r $<
	touch $@

# The project itself, editable, so `slotserve` (the console script) and `python -m service` work anywhere.
$(VENV)/.editable: generated/.stamp pyproject.toml $(VENV)/.runtime
	@echo "make: installing slotserve itself (editable: the slotserve command) into $(VENV)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# The one target that makes generated code. protoc writes bare `import model_config_pb2`; the sed turns those
# into package-relative imports so generated/ is an ordinary package.
proto: generated/.stamp
generated/.stamp: $(VENV)/.runtime $(wildcard proto/*.proto)
	@echo "make: generating the gRPC code (generated/) from proto/"
	rm -rf generated && mkdir -p generated
	$(PY) -m grpc_tools.protoc -I proto --python_out=generated --pyi_out=generated --grpc_python_out=generated proto/*.proto
	sed -i -E 's/^import ([a-z_]+_pb2) as /from . import \1 as /' generated/*.py generated/*.pyi
	printf '"""Generated by `make proto` from proto/*.proto. Do not edit: change the .proto and regenerate."""\n' > generated/__init__.py
	touch $@

models: $(DEMO_REPOSITORY)/.stamp
$(DEMO_REPOSITORY)/.stamp: $(VENV)/.editable $(wildcard demo/*.py)
	@echo "make: building the demo models into $(DEMO_REPOSITORY) (downloads one checkpoint the first time)"
	$(PY) -m demo.build_repository --output $(DEMO_REPOSITORY)
	touch $@

# The demo models are built first only when the demo repository is what is served.
run: setup-runtime $(if $(filter $(abspath $(DEMO_REPOSITORY)),$(abspath $(REPOSITORY))),models)
	$(PY) -m service --model-repository $(REPOSITORY) --host $(HOST) --port $(PORT) $(ARGS)

# What REPOSITORY will do on slotserve, read without serving it (docs/migrating-from-triton.md); ARGS adds the
# check's flags (--load, --format json, --parallel-jobs N, ...). Exit status 1 when a model would not serve. It
# needs what serving needs, not the dev tools.
.PHONY: check
check: setup-runtime $(if $(filter $(abspath $(DEMO_REPOSITORY)),$(abspath $(REPOSITORY))),models)
	$(PY) -m service check $(REPOSITORY) $(ARGS)

# The Node.js interop client's packages (skipped with a notice where npm is missing; its test then skips).
node-deps: tests/interop/node/node_modules/.stamp
tests/interop/node/node_modules/.stamp: tests/interop/node/package.json tests/interop/node/package-lock.json
	@if command -v npm >/dev/null; then \
	  cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.stamp; \
	else echo "npm not found: the Node.js interop test will be skipped"; fi

# The hygiene gate, also run first by `make test` (and so by CI): ruff's lint rules, ruff's formatting (a check: it
# changes nothing) and mypy, each configured in pyproject.toml.
# mypy with no arguments reads pyproject.toml: every folder of its `files`, with --strict's flags on service/,
# client/ and engine/interface.py (its [[tool.mypy.overrides]]), so a loosened annotation there fails the lint.
lint: setup-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# -rs: the summary says why each skipped test was skipped (a missing tool, no GPU, ...).
test: lint setup models node-deps
	$(PY) -m pytest -rs $(PYTEST_ARGS)

# The inner loop (tests/README.md): the in-process suites that need nothing beyond the venv and the demo models
# (no Triton venv, no node, no server processes of their own), about 1500 tests in 2-4 minutes on two cores.
# No lint: run `make lint` beside it. `make test` stays the whole suite and CI's command.
FAST_SUITES := tests/unit tests/contract tests/docs
test-fast: setup models
	$(PY) -m pytest -q -rs $(FAST_SUITES) $(PYTEST_ARGS)

contract: setup models
	$(PY) -m pytest -q -m cell --contract-report $(PYTEST_ARGS)

# The generated parts of docs/: the flag tables (from the server's parser) and the behaviour cells (cells.tsv, our
# words in tests/contract/behaviour.tsv, the tests' cell marks). tests/docs/ fails when they are stale.
docs: setup
	$(PY) -m tests.docs.generate

# The concurrency-heavy suites (contract, shutdown, integration, admission), STRESS_RUNS times, with a CPU hog per
# core and sys.setswitchinterval(1e-6) in pytest and every server it starts (tests/stress/run.py says how). Must pass.
STRESS_RUNS ?= 5
stress: setup models
	$(PY) -m tests.stress.run --runs $(STRESS_RUNS) $(PYTEST_ARGS)

# Benchmarks (not tests): slotserve against a bare grpcio server, slot scaling, memory, admission, cold loads.
BENCH_ARGS ?=
bench: setup models
	bench/setup.sh && $(PY) bench/run.py $(BENCH_ARGS)

# Reliability (not a test): a server under mixed traffic from several processes, then an audit of every request,
# slot, thread, file descriptor and the memory bound. Exits non-zero if an assertion fails.
SOAK_SECONDS ?= 300
soak: setup models
	$(PY) soak/run.py --seconds $(SOAK_SECONDS)

# A mutation run of the core (not a test, not part of `make test`: tens of minutes on two cores): one planted bug at
# a time in service/core/admission.py, batching.py and residency.py, each module's tests run against it; prints the
# kill rate per module and the survivors (docs/architecture.md, "Mutation run"). MUTATE_ARGS="--module batching".
MUTATE_ARGS ?=
mutate: setup
	$(PY) -m tests.mutation.run $(MUTATE_ARGS)

# On a machine with an NVIDIA GPU: asks the driver which TensorRT extra it runs (tensorrt-cu12 or tensorrt-cu13;
# engine/tensorrt/driver.py says which and why, or why neither), installs it into a venv of its own (the test venv
# keeps the GPU-less modules the conformance test pins), then checks the TensorRT path on the demo models.
GPU_VENV := $(VENV)/gpu
gpu-check: setup models
	@extra=$$($(PY) -m engine.tensorrt.driver) || exit $$?; \
	if [ "$$(cat $(GPU_VENV)/.extra 2>/dev/null)" != "$$extra" ]; then \
	  rm -rf $(GPU_VENV) && $(PYTHON) -m venv $(GPU_VENV) && \
	  $(GPU_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt && \
	  $(GPU_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$$extra]" && \
	  echo "$$extra" > $(GPU_VENV)/.extra || exit $$?; \
	fi; \
	$(GPU_VENV)/bin/python -m engine.tensorrt.gpu_check --repository $(REPOSITORY) $(ARGS)

# Re-resolve the transitive pins after changing requirements*.txt.
lock:
	rm -rf /tmp/slotserve-lock && $(PYTHON) -m venv /tmp/slotserve-lock
	/tmp/slotserve-lock/bin/pip install --quiet -r requirements-dev.txt
	{ echo "# Transitive pins (pip freeze of the dev environment, minus the direct pins). Regenerate with 'make lock'."; \
	  /tmp/slotserve-lock/bin/pip freeze | grep -viE "^($$(sed -nE 's/^([A-Za-z0-9_.-]+)(\[.*\])?==.*/\1/p' requirements.txt requirements-dev.txt | paste -sd'|'))=="; } > constraints.txt

clean:
	rm -rf $(VENV) generated $(DEMO_REPOSITORY) tests/interop/node/node_modules .pytest_cache
