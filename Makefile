# Fastformer Serving: the two commands are `make serve` and `make test`.
#
#   make serve   install deps if missing, build, train the demo model, serve it over gRPC
#   make test    install deps if missing, build, run every suite (lint, unit, golden, e2e, sanitizer;
#                tests/README.md says which suite a test belongs in)
#   make build   build into build/ (binaries in build/bin/)
#   make bench   the engine benchmarks recorded in docs/benchmarks.md (against PyTorch, ONNX
#                Runtime and OpenVINO; both pip-installed into .venv-bench on first use)
#
# CI (.ci/run) runs `make test`, then the longer checks: `make image-test` (the CPU container
# image built with buildah and run), `make image-test-cuda` (the CUDA image from NVIDIA's PyPI
# wheels, run with no GPU), `make fuzz FUZZ_SECONDS=30`, `make test-tsan` and
# `make soak SOAK_SECONDS=60`. Those targets live in mk/*.mk.

# The caches outside the checkout (compiler, venvs, the trained demo model) and the generator.
include mk/cache.mk

# The interpreter that imports torch: Debian's /usr/bin/python3 (python3-torch), which
# may not be the python3 first on PATH.
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do $$p -c 'import torch' >/dev/null 2>&1 && { echo $$p; break; }; done)
BUILD_DIR ?= build
ASAN_DIR ?= build-asan
JOBS ?= $(shell nproc)
# Warnings are errors for developers and CI alike: one set of flags, so the compiler cache
# (mk/cache.mk) serves both and a cached object never stands for a build with other flags.
WERROR ?= ON
SERVER ?= ON
CMAKE_ARGS ?=
MODEL_DIR ?= models/demo
DEMO_PRESET ?= official

.PHONY: all deps build check test test-unit test-golden test-e2e test-clients test-deploy serve demo-model demo-trained bench bench-venv bench-serve clean

all: build

deps:
	@deploy/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=$(SERVER) -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The suites of make test, in order; each one's wall time is recorded (tools/step.sh: printed
# after it, and kept in $FASTFORMER_STEP_LOG when set, as .ci/run does). Suites joined by `+` run
# side by side (tools/side_by_side.sh): each group pairs suites that time nothing, where one
# leaves a core idle (test-e2e, test-kserve, test-http, test-deploy wait on servers and sockets:
# 35 of 106 s, 23 of 36 s, 26 of 39 s of CPU, measured 2026-12-04). test-demo times nothing and
# keeps about one core busy (84 s of CPU in 81 s): it fills the core kserve, http and clients
# leave idle (78 s of CPU in 63 s). test-repository (its fairness and swap figures) and
# test-gpu-rehearsal (its stage budgets) run alone; test-asan runs its own groups (mk/sanitizers.mk).
TEST_SUITES := lint test-unit test-golden+test-e2e test-kserve+test-http+test-clients+test-demo test-repository \
  test-deploy+test-tokenizer test-gpu-rehearsal test-asan

test: venvs
	@tools/step.sh "make test: build" $(MAKE) --no-print-directory build
	@tools/step.sh "make test: build-asan" $(MAKE) --no-print-directory build-asan
	@for suite in $(TEST_SUITES); do \
	  case $$suite in \
	    *+*) MAKE="$(MAKE)" tools/side_by_side.sh "make test" $$(echo $$suite | tr + ' ') || exit 1 ;; \
	    *) tools/step.sh "make test: $$suite" $(MAKE) --no-print-directory $$suite || exit 1 ;; \
	  esac; \
	done

# The quick loop for developers (about 1 minute warm): the Release build, lint, the unit tests,
# the golden parity tests and a fast end-to-end subset (parity, bad input and text through the
# real server). Use it while working; run the full `make test` (about 12 minutes warm) before a
# change is committed for CI, and whenever a change touches the sanitized, HTTP, KServe,
# repository, client, deploy, tokenizer, demo or GPU paths (tests/README.md, "Which command").
CHECK_E2E := tests/e2e/test_server_parity.py tests/e2e/test_server_bad_input.py tests/e2e/test_server_text.py
check: build
	@tools/step.sh "make check: lint" $(MAKE) --no-print-directory lint
	@tools/step.sh "make check: unit" $(MAKE) --no-print-directory test-unit
	@tools/step.sh "make check: golden parity" env FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin \
	  $(PYTHON) -m pytest tests/golden/test_parity.py -q
	@tools/step.sh "make check: e2e subset" env FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin \
	  $(PYTHON) -m pytest $(CHECK_E2E) -q

test-unit:
	@$(call CTEST,$(BUILD_DIR),release,--output-on-failure -j$(JOBS))

test-golden:
	@test -n "$(PYTHON)" || { echo "no python3 that imports torch: run deploy/install-deps.sh"; exit 1; }
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin FASTFORMER_CMAKE4=$(CMAKE4_VENV)/bin/cmake \
	  $(PYTHON) -m pytest tests/golden tests/gpu -q

# The real server on loopback: gRPC clients, promtool, a real Prometheus.
test-e2e:
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin $(PYTHON) -m pytest tests/e2e -q

# The clients against the real server: the Python package, the CLI and the load generator.
test-clients:
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin $(PYTHON) -m pytest $(wildcard tests/python_client tests/client) -q

# The deployment files (compose, Prometheus, Grafana, Kubernetes) against the real server.
test-deploy:
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin $(PYTHON) -m pytest $(wildcard tests/deploy) -q

$(MODEL_DIR)/model.safetensors:
	$(PYTHON) tools/make_demo_model.py --preset $(DEMO_PRESET) --seed 1 --tokenizer --out $(MODEL_DIR)

demo-model: deps $(MODEL_DIR)/model.safetensors

# A trained demo model (issue 15, groundwork): the official notebook's model trained on
# Debian's manpages + manpages-dev (4 classes by manual section), ~3 minutes on 2 cores,
# exported to models/manpages and checked against fastformer-encode (logits within 1e-4).
TRAINED_MODEL_DIR ?= models/manpages
demo-trained: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=$(SERVER) -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j$(JOBS) --target fastformer-encode
	$(PYTHON) tools/train_demo_model.py --out $(TRAINED_MODEL_DIR) --verify-with $(BUILD_DIR)/bin/fastformer-encode

# The gRPC server: gRPC on :50051, Prometheus metrics on :8002/metrics. It serves the trained
# demo model (models/manpages, trained on first use: about 3 minutes on 2 cores) or, when that
# cannot be built, the random one (models/demo), saying why. MODEL_DIR=... serves that one.
serve: build demo-model
ifeq ($(origin MODEL_DIR),command line)
	$(BUILD_DIR)/bin/fastformer-server --model-dir $(MODEL_DIR) $(SERVE_ARGS)
else
	@dir=$(TRAINED_MODEL_DIR); \
	if [ ! -f $$dir/train_report.json ]; then \
	  echo "make serve: training the demo model into $$dir (once; about 3 minutes on 2 cores, progress every 10 s)"; \
	  $(PYTHON) tools/train_demo_model.py --out $$dir || { dir=$(MODEL_DIR); \
	    echo "make serve: the trained demo model could not be built (the error is above); serving the random demo model $$dir instead (it takes text, but its labels mean nothing)"; }; \
	fi; \
	echo "make serve: serving $$dir"; \
	exec $(BUILD_DIR)/bin/fastformer-server --model-dir $$dir $(SERVE_ARGS)
endif

bench: build
	$(PYTHON) tools/run_benchmarks.py --build-dir $(BUILD_DIR) --long

# .venv-bench: a venv over $(PYTHON)'s packages (torch) with onnxruntime from PyPI, for
# tools/bench_onnxruntime.py. run_benchmarks.py and the golden test make it themselves.
bench-venv: deps
	$(PYTHON) tools/ort_env.py

# The server under a fastformer-loadgen concurrency sweep against fastformer-bench; writes
# the table and docs/images/loadgen-cpu.png into docs/benchmarks.md.
bench-serve: build
	$(PYTHON) tools/run_bench_serve.py --build-dir $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR)

# Sanitizer builds (mk/sanitizers.mk), fuzzing (mk/fuzz.mk), the image test (mk/image.mk),
# the soak test (mk/soak.mk), the GPU check's dress rehearsal (mk/gpu.mk).
include $(sort $(filter-out mk/cache.mk,$(wildcard mk/*.mk)))
