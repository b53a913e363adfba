# The caches a fresh clone finds warm (issue 32), all outside the checkout under
# FASTFORMER_CACHE (default /var/cache/fastformer; tests/README.md, "Caches"):
#   ccache/        every C, C++ and CUDA compile (CMakeLists.txt wires it; FASTFORMER_CCACHE_DIR)
#   venv/          the Python venvs, one per pinned requirement set (tools/cached_venv.sh)
#   demo-model/    the trained demo model, keyed by a hash of its inputs (mk/demo.mk)
#   cuda-wheels/   NVIDIA's CUDA wheels of the CUDA image (deploy/cuda-wheels.txt, by hash)
#   carry-server/  the GPU lease's packed server closure, keyed by its files' hashes
#                  (deploy/carry-gpu-deps.sh --server)
#   gpu-expected/  the GPU check's CPU float32 answers (tests/gpu/server_expected.py)
#   ctest-costs/   each build tree's record of its tests' times, for ctest's order (below)
#   fuzz-corpus/   what make fuzz added to the seeds, per target (mk/fuzz.mk)
# Each one may be deleted at any time: the next run rebuilds it (slower, never different; a
# deleted fuzz-corpus/ only makes the next make fuzz start from the seeds, as a new machine does).
# Included first by the Makefile.
FASTFORMER_CACHE ?= /var/cache/fastformer
export FASTFORMER_CCACHE_DIR ?= $(FASTFORMER_CACHE)/ccache
VENV_CACHE ?= $(FASTFORMER_CACHE)/venv

# One generator on every machine that has it: Ninja (deploy/install-deps.sh installs it). A build
# tree configured earlier keeps its own generator (CMake reads this only for a new tree).
ifneq ($(shell command -v ninja 2>/dev/null),)
export CMAKE_GENERATOR ?= Ninja
endif

# ctest's record of each test's time (Testing/Temporary/CTestCostData.txt), kept per build tree
# under $(FASTFORMER_CACHE)/ctest-costs (issue 32's caches): a fresh clone's tree has none, and
# ctest -j then starts the tests in the order they are defined, so the longest ones (the emulated
# CUDA engine's and kernels' sweeps, 20 to 120 s each under a sanitizer) can end up running last,
# one core idle. With the record, ctest starts the longest first. It changes only the order
# (every test still runs; ctest -j already runs them in any interleaving).
#   $(call CTEST,TREE,NAME,ARGS): ctest --test-dir TREE ARGS, the record NAME copied in first (when
#   the tree has none) and the tree's updated one copied back after (even when a test failed).
CTEST_COSTS ?= $(FASTFORMER_CACHE)/ctest-costs
CTEST = f=$(1)/Testing/Temporary/CTestCostData.txt c=$(CTEST_COSTS)/$(2).txt; \
  mkdir -p $(1)/Testing/Temporary $(CTEST_COSTS); \
  if [ ! -s $$f ] && [ -s $$c ]; then cp $$c $$f; fi; \
  ctest --test-dir $(1) $(3); rc=$$?; \
  if [ -s $$f ]; then cp $$f $$c.$$$$ && mv -f $$c.$$$$ $$c; fi; exit $$rc

.PHONY: ccache-stats
# The compiler cache's counters (.ci/run prints them at the end).
ccache-stats:
	@CCACHE_DIR=$(FASTFORMER_CCACHE_DIR) ccache --show-stats 2>/dev/null || echo "ccache: not installed"

# The test suites' venvs (tools/cached_venv.sh): NAME-KEY directories under $(VENV_CACHE), each
# made by its .complete rule; the requirements are tests/requirements/NAME.txt (pins.txt).
VENV_TOOL = VENV_CACHE=$(VENV_CACHE) tools/cached_venv.sh
# Triton's clients (tests/kserve, tests/repository, test-asan) with perf_analyzer, taken from
# the tritonclient 2.41.0 wheel (the newer perf-analyzer packages do not install here).
TRITON_VENV_ARGS := --system-site-packages --post 'tools/perf_analyzer_from_wheel.sh 2.41.0' \
  --key-file tools/perf_analyzer_from_wheel.sh
TRITON_VENV := $(shell $(VENV_TOOL) path triton $(TRITON_VENV_ARGS))
# sentence-transformers without its dependencies (transformers, a PyPI torch): tests/http loads
# its util/quantization.py alone, the reference of the embedding types.
HTTP_VENV_ARGS := --system-site-packages --post '"$$VENV/bin/pip" install -q --no-deps \
  -c tests/requirements/pins.txt sentence-transformers'
HTTP_VENV := $(shell $(VENV_TOOL) path http $(HTTP_VENV_ARGS))
TOKENIZER_VENV := $(shell $(VENV_TOOL) path tokenizer --system-site-packages)
LINT_VENV := $(shell $(VENV_TOOL) path lint --python python3)
# CMake 4 (PyPI), for the GoogleTest wiring test of tests/gpu under a lent GPU machine's CMake.
CMAKE4_VENV := $(shell $(VENV_TOOL) path cmake)
# tools/ort_env.py's venv (ONNX Runtime, OpenVINO) for the golden bench tests and make bench,
# keyed by that script and the Debian packages it sees.
export FASTFORMER_BENCH_VENV ?= $(VENV_CACHE)/bench-$(shell tools/cache_key.sh --file tools/ort_env.py \
  --packages 'python3*' --text "$$(/usr/bin/python3 -VV)")

$(TRITON_VENV)/.complete:
	$(VENV_TOOL) ensure triton $(TRITON_VENV_ARGS) >/dev/null
$(HTTP_VENV)/.complete:
	$(VENV_TOOL) ensure http $(HTTP_VENV_ARGS) >/dev/null
$(TOKENIZER_VENV)/.complete:
	$(VENV_TOOL) ensure tokenizer --system-site-packages >/dev/null
$(LINT_VENV)/.complete:
	$(VENV_TOOL) ensure lint --python python3 >/dev/null
$(CMAKE4_VENV)/.complete:
	$(VENV_TOOL) ensure cmake >/dev/null

.PHONY: venvs
# Every venv of make test (CI makes them before the suites, so suites side by side never wait).
venvs: $(TRITON_VENV)/.complete $(HTTP_VENV)/.complete $(TOKENIZER_VENV)/.complete $(LINT_VENV)/.complete \
  $(CMAKE4_VENV)/.complete
