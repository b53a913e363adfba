# libFuzzer targets (tests/fuzz, docs/reliability.md "Fuzzing"), built with clang in build-fuzz.
#
#   make fuzz FUZZ_SECONDS=N   build, then run each target N seconds (.ci/run: 60); fails on
#                              any crash, leak, hang or out-of-memory, prints executions and
#                              coverage per target
#   make build-fuzz            only build them
#
# Every library is compiled with -fsanitize=fuzzer-no-link,address,undefined and the targets
# link -fsanitize=fuzzer. The corpus in the repository is only read: what the fuzzer adds
# goes to $(FUZZ_DIR)/work. The seeds and regression inputs also run in `make test`
# (ctest: fuzz_*_replay).
.PHONY: build-fuzz fuzz

FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= fuzz_model_load fuzz_request fuzz_infer_request fuzz_http fuzz_batch_queue fuzz_tokenizer

build-fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DFASTFORMER_CUDA=OFF -DFASTFORMER_SERVER=ON -DFASTFORMER_TESTS=OFF -DFASTFORMER_FUZZ=ON \
	  -DFASTFORMER_SANITIZE=fuzzer-no-link,address,undefined -DFASTFORMER_WERROR=OFF $(CMAKE_ARGS)
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target $(FUZZ_TARGETS)

fuzz: build-fuzz
	tests/fuzz/run_fuzz.sh $(FUZZ_DIR)/bin $(FUZZ_DIR)/work $(FUZZ_SECONDS) $(FUZZ_TARGETS)
