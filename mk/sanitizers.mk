# Sanitizer builds and suites (included by the Makefile).
.PHONY: build-asan test-asan

# AddressSanitizer + UndefinedBehaviorSanitizer build of the engine, tools and unit tests.
build-asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DFASTFORMER_CUDA=OFF -DFASTFORMER_SERVER=OFF \
	  -DFASTFORMER_SANITIZE=address,undefined -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(ASAN_DIR) -j$(JOBS)

# The unit tests and the bad-input end-to-end tests under ASan/UBSan.
test-asan:
	ctest --test-dir $(ASAN_DIR) --output-on-failure -j$(JOBS)
	FASTFORMER_BIN_DIR=$(CURDIR)/$(ASAN_DIR)/bin ASAN_OPTIONS=detect_leaks=1 \
	  $(PYTHON) -m pytest tests/golden -q -m asan

