# Sanitizer builds and suites (included by the Makefile). docs/reliability.md, "Sanitizers",
# says what runs under each, what is left out and why, and why each suppression in
# tests/sanitizers/*.supp is there.
#
#   make build-asan test-asan   AddressSanitizer + UndefinedBehaviorSanitizer (part of make test)
#   make test-tsan              ThreadSanitizer: builds build-tsan, then runs (.ci/run)
#   make test-tsan-e2e          the server e2e tests under TSan (not in CI: gRPC false positives)
.PHONY: build-asan test-asan build-tsan build-tsan-all test-tsan test-tsan-e2e

TSAN_DIR ?= build-tsan
SANITIZER_FILES := $(CURDIR)/tests/sanitizers

# A report fails the run: ASan and TSan halt at the first report (exit non-zero), UBSan aborts
# at the first error (-fno-sanitize-recover=all), LSan fails the exit of a leaking process, and
# the pytest suites fail a test whose server log holds a report (the server fixture base,
# tools/fastformer_testing/sanitizers.py). The sanitizer gates in tests/sanitizers
# (ctest) prove each of these fails.
SANITIZER_ENV := \
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:suppressions=$(SANITIZER_FILES)/asan.supp \
  LSAN_OPTIONS=suppressions=$(SANITIZER_FILES)/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(SANITIZER_FILES)/ubsan.supp \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$(SANITIZER_FILES)/tsan.supp

# ---- AddressSanitizer + UndefinedBehaviorSanitizer -----------------------------------------

# One clang build serves ASan/UBSan and fuzzing (issue 32): every library, program, test and
# libFuzzer target (tests/fuzz) compiled once with -fsanitize=fuzzer-no-link,address,undefined
# at -O1 with assertions on (Debug plus -O1), the fuzz targets linked with -fsanitize=fuzzer
# (mk/fuzz.mk builds them in this same tree). The coverage instrumentation costs the sanitized
# suites little at -O1 against the former gcc -O0 build (tests/README.md gives the figures).
ASAN_CONFIGURE = CC=clang CXX=clang++ cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS=-O1 -DFASTFORMER_CUDA=OFF -DFASTFORMER_SERVER=ON \
  -DFASTFORMER_FUZZ=ON -DFASTFORMER_SANITIZE=fuzzer-no-link,address,undefined \
  -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)

# Everything: the engine (CPU and emulated CUDA), batching, server, clients, tools, tests and the
# fuzz targets.
build-asan: deps
	$(ASAN_CONFIGURE)
	cmake --build $(ASAN_DIR) -j$(JOBS)

# The sanitized runs select their ctest tests by label (ctest -L/-LE), each label given where its
# tests are defined (tests/*/CMakeLists.txt, fastformer_gtest_discover in tests/CMakeLists.txt):
#   client               the C++ client against a real server (tests/client)
#   client_unsanitized   client tests for unsanitized builds only (ctest -L client selects them too)
#   no_tsan              left out of test-tsan
#
# Left out under ASan (a Debug build, its engine several times slower than Release), each
# passing in the Release suites:
#   label client_unsanitized (tests/client/CMakeLists.txt): fastformer_client_package links an
#     uninstrumented consumer against the instrumented library; ClientRetry's three timed tests
#     have retry schedules timed for a Release server (capacity must free within the retry
#     budget; 3 attempts must fit in 150 ms).
#   e2e sigterm/deadline tests: their load is sized for the Release engine's speed (drain within
#     --shutdown-timeout-s 30, 40 x 2000 tokens within 60 s deadlines).
ASAN_CTEST_SELECT := -LE '^client_unsanitized$$'
ASAN_E2E_DESELECT := \
  --deselect tests/e2e/test_server_lifecycle.py::test_sigterm_under_load \
  --deselect tests/e2e/test_server_overload.py::test_deadlines_under_load \
  --deselect tests/e2e/test_faults.py::test_sigterm_under_continuous_load

# Unit (incl. the emulated CUDA engine), emulation, fuzz-corpus replay, client and sanitizer-gate
# tests (ctest); the bad-input golden tests; the end-to-end suite, Triton's clients
# (tests/kserve, perf_analyzer included), the HTTP suite (tests/http: the listener under
# every third-party client, bad input and slow clients; about 1 min) and the model repository
# suite (tests/repository: loads, hot swaps under load, unloads in flight, broken versions)
# against the ASan/UBSan server.
#
# In three groups, the parts joined by `+` side by side (tools/side_by_side.sh, as make test's
# TEST_SUITES; each part's wall and CPU time recorded by tools/step.sh): ctest keeps both cores
# busy (430 s of CPU) while the e2e suite mostly waits on its servers (47 s of CPU in 129 s);
# golden, kserve and http wait too (5 + 32 + 38 s of CPU in 5 + 43 + 61 s). The repository suite
# runs alone: its fairness bound and swap figures are timed (tests/README.md, "CI time").
ASAN_PARTS := test-asan-ctest+test-asan-e2e test-asan-golden+test-asan-kserve+test-asan-http \
  test-asan-repository
ASAN_RUN := $(SANITIZER_ENV) FASTFORMER_BIN_DIR=$(CURDIR)/$(ASAN_DIR)/bin
.PHONY: test-asan-ctest test-asan-golden test-asan-e2e test-asan-kserve test-asan-http test-asan-repository

test-asan: $(TRITON_VENV)/.complete $(HTTP_VENV)/.complete
	@for part in $(ASAN_PARTS); do \
	  case $$part in \
	    *+*) MAKE="$(MAKE)" tools/side_by_side.sh "test-asan" $$(echo $$part | tr + ' ') || exit 1 ;; \
	    *) tools/step.sh "test-asan: $$part" $(MAKE) --no-print-directory $$part || exit 1 ;; \
	  esac; \
	done

test-asan-ctest:
	export $(SANITIZER_ENV); $(call CTEST,$(ASAN_DIR),asan,--output-on-failure -j$(JOBS) $(ASAN_CTEST_SELECT))
test-asan-golden:
	$(ASAN_RUN) $(PYTHON) -m pytest tests/golden -q -m asan
test-asan-e2e:
	$(ASAN_RUN) $(PYTHON) -m pytest tests/e2e -q $(ASAN_E2E_DESELECT)
test-asan-kserve: $(TRITON_VENV)/.complete
	$(ASAN_RUN) $(TRITON_VENV)/bin/python -m pytest tests/kserve -q
test-asan-http: $(TRITON_VENV)/.complete $(HTTP_VENV)/.complete
	$(ASAN_RUN) PERF_ANALYZER=$(TRITON_VENV)/bin/perf_analyzer $(HTTP_VENV)/bin/python -m pytest tests/http -q
test-asan-repository: $(TRITON_VENV)/.complete
	$(ASAN_RUN) $(TRITON_VENV)/bin/python -m pytest tests/repository -q

# ---- ThreadSanitizer -----------------------------------------------------------------------

# Only what test-tsan runs (its ctest selection: every test but the labels client,
# client_unsanitized and no_tsan): the client programs and their tests are not built here
# (test-tsan-e2e builds them). A test whose executable is missing from this list fails test-tsan
# loudly ("Could not find executable": gtest's placeholder test <target>_NOT_BUILT, which carries
# its binary's label, fastformer_gtest_discover in tests/CMakeLists.txt).
TSAN_TARGETS := fastformer_unit_tests fastformer_emulation_tests fastformer_request_tests \
  fastformer_tokenizer_tests fastformer_auth_tests sanitizer_gate_data_race \
  fuzz_model_load_replay fuzz_batch_queue_replay fuzz_tokenizer_replay fuzz_request_replay \
  fuzz_infer_request_replay fuzz_batch_input_replay fastformer_repository_tests \
  fastformer_jobs_tests
# fastformer_client_tests (label client) is not built here: its placeholder test carries the
# label, so it is left out with the others; any other test not built still fails.
# Label no_tsan, each run in make test and under ASan:
#   the structure checks (tests/structure), which read the Release binaries of make test;
#   the HTTP layer's tests (fastformer_http_tests in tests/unit, fuzz_http_replay in
#     tests/fuzz), single-threaded on Boost.Beast and Debian's gRPC (the intake), neither built
#     with TSan (fastformer_http_tests is not built here: its placeholder carries the label);
#   the three largest-shape kernel sweeps, 100 to 120 s each under TSan (KeyScoresAndKeyPooling
#     over three dtypes in tests/emulation, given in tests/CMakeLists.txt; every GEMM site's
#     leading dimensions and the base-long emulated engine in tests/unit), which take the same
#     threaded paths as the smaller emulation and engine tests that stay; without them test-tsan
#     takes about half as long;
#   the emulated CUDA engine's opt-in kernels in three dtypes and the key/query pooling race check
#     (94 to 127 s and 65 s each under TSan, 2026-12-07): the emulated engine starts no thread and
#     the kernels' threads are fibers on the caller's, so TSan has nothing to see in them (the
#     engine's threaded use, StagingOnAnotherThreadWhileEncoding, stays); they took 45% and 9% of
#     test-tsan's test time;
#   the two config.pbtxt tests (tests/unit, fastformer_repository_tests): they parse a map field
#     (parameters) with protobuf's TextFormat, whose inline map code compiled with
#     -fsanitize=thread does not match Debian's uninstrumented libprotobuf (a SEGV in
#     RepeatedPtrFieldBase::Clear, not a race); single-threaded. The repository's swap,
#     load-failure and unload tests stay.
TSAN_CTEST_SELECT := -LE '^(client|client_unsanitized|no_tsan)$$'

build-tsan: deps
	cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFASTFORMER_CUDA=OFF -DFASTFORMER_SERVER=ON \
	  -DFASTFORMER_SANITIZE=thread -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(TSAN_DIR) -j$(JOBS) --target $(TSAN_TARGETS)

build-tsan-all: deps build-tsan
	cmake --build $(TSAN_DIR) -j$(JOBS)

# The batching queue and the scheduler (SchedulerTest.ConcurrentProducers...: the server's
# batching path with all its threads at once: producers, a canceller, deadlines, the forming
# and compute threads, engine failures), the CPU engine's thread pool, the emulated CUDA engine,
# the emulation (fibers), the fuzz-corpus replays and the data-race gate (ctest, all but the
# client label). The client tests and the server e2e tests use Debian's gRPC, which is not
# built with TSan: its hand-offs between threads are invisible to TSan and reported as races
# (docs/reliability.md, "Sanitizers"); until gRPC is instrumented they run in test-tsan-e2e,
# outside CI.
#
# The model repository's swap path runs here as fastformer_repository_tests (RepositoryTest:
# swaps under concurrent requests on real CPU engines, no gRPC); the server itself stays out
# of CI's TSan run for the reason above.
test-tsan: build-tsan
	export $(SANITIZER_ENV); $(call CTEST,$(TSAN_DIR),tsan,--output-on-failure -j$(JOBS) $(TSAN_CTEST_SELECT))

TSAN_E2E := tests/e2e/test_server_batching.py tests/e2e/test_server_overload.py \
  tests/e2e/test_server_lifecycle.py $(wildcard tests/e2e/test_faults.py)
test-tsan-e2e: build-tsan-all
	$(SANITIZER_ENV) ctest --test-dir $(TSAN_DIR) --output-on-failure -j$(JOBS) -L '^client$$'
	$(SANITIZER_ENV) FASTFORMER_BIN_DIR=$(CURDIR)/$(TSAN_DIR)/bin $(PYTHON) -m pytest $(TSAN_E2E) -q
