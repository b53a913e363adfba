# libFuzzer targets (tests/fuzz, docs/reliability.md "Fuzzing"), built with clang in $(ASAN_DIR).
#
#   make fuzz FUZZ_SECONDS=N   build, then run each target N seconds (.ci/run: 60); fails on
#                              any crash, leak, hang or out-of-memory, prints executions and
#                              coverage per target
#   make build-fuzz            only build them
#
# The targets are built in the sanitizer tree (mk/sanitizers.mk, $(ASAN_DIR)): every library
# compiled once with -fsanitize=fuzzer-no-link,address,undefined at -O1, which also serves
# make test-asan; the targets link -fsanitize=fuzzer. The corpus in the repository is only
# read: what the fuzzer adds goes to $(FUZZ_DIR)/work. The seeds and regression inputs also run
# in `make test` (ctest: fuzz_*_replay, in both build trees).
.PHONY: build-fuzz fuzz

FUZZ_DIR = $(ASAN_DIR)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= fuzz_model_load fuzz_request fuzz_infer_request fuzz_http fuzz_batch_queue fuzz_tokenizer

build-fuzz: deps
	$(ASAN_CONFIGURE)
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target $(FUZZ_TARGETS)

fuzz: build-fuzz
	tests/fuzz/run_fuzz.sh $(FUZZ_DIR)/bin $(FUZZ_DIR)/work $(FUZZ_SECONDS) $(FUZZ_TARGETS)
