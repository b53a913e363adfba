# libFuzzer targets (tests/fuzz, docs/reliability.md "Fuzzing"), built with clang in $(ASAN_DIR).
#
#   make fuzz FUZZ_SECONDS=N   build, then run each target N seconds (.ci/run: 30); fails on
#                              any crash, leak, hang or out-of-memory, prints executions and
#                              coverage per target
#   make build-fuzz            only build them
#
# The targets are built in the sanitizer tree (mk/sanitizers.mk, $(ASAN_DIR)): every library
# compiled once with -fsanitize=fuzzer-no-link,address,undefined at -O1, which also serves
# make test-asan; the targets link -fsanitize=fuzzer. The corpus in the repository is only
# read: what the fuzzer adds goes to $(FUZZ_DIR)/work/corpus (a link into the cache, below). The seeds and regression inputs also run
# in `make test` (ctest: fuzz_*_replay, in both build trees).
.PHONY: build-fuzz fuzz

FUZZ_DIR = $(ASAN_DIR)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= fuzz_model_load fuzz_request fuzz_infer_request fuzz_http fuzz_batch_queue fuzz_tokenizer fuzz_multipart fuzz_batch_input

build-fuzz: deps
	$(ASAN_CONFIGURE)
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target $(FUZZ_TARGETS)

# The work corpus (what the fuzzer adds to the seeds) is kept in the cache outside the checkout
# ($(FUZZ_CORPUS), mk/cache.mk; WORK/corpus is a link to it), so each run, in a fresh clone too,
# starts from the coverage every earlier run on this machine reached instead of from the seeds
# alone; the crash artifacts stay in the tree (WORK/artifacts). libFuzzer only adds an input
# that reaches a new feature, and reads inputs from another build of the code like any other
# (FUZZ_CORPUS= starts from the seeds alone, as before).
FUZZ_CORPUS ?= $(FASTFORMER_CACHE)/fuzz-corpus

fuzz: build-fuzz
	@mkdir -p $(FUZZ_DIR)/work
	@if [ -n "$(FUZZ_CORPUS)" ]; then mkdir -p $(FUZZ_CORPUS) && \
	  if [ -d $(FUZZ_DIR)/work/corpus ] && [ ! -L $(FUZZ_DIR)/work/corpus ]; then \
	    cp -rn $(FUZZ_DIR)/work/corpus/. $(FUZZ_CORPUS)/ && rm -rf $(FUZZ_DIR)/work/corpus; fi && \
	  ln -sfn $(FUZZ_CORPUS) $(FUZZ_DIR)/work/corpus && \
	  echo "fuzz: work corpus $(FUZZ_CORPUS) ($$(find $(FUZZ_CORPUS) -type f | wc -l) inputs from earlier runs)"; \
	elif [ -L $(FUZZ_DIR)/work/corpus ]; then rm $(FUZZ_DIR)/work/corpus; fi
	tests/fuzz/run_fuzz.sh $(FUZZ_DIR)/bin $(FUZZ_DIR)/work $(FUZZ_SECONDS) $(FUZZ_TARGETS)
