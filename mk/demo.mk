# The tests on the trained demo model (tests/demo; issue 15, point 5). The model is trained
# once by tools/train_demo_model.py (~3 minutes on 2 cores) into the cache outside the checkout
# (mk/cache.mk), at $(FASTFORMER_CACHE)/demo-model/KEY, so every clone on this machine finds it.
# KEY hashes the model's inputs: the training scripts and everything they import from tools/, the
# arguments, the Debian packages involved (PyTorch, NumPy, OpenBLAS, the man pages it learns),
# the thread count and the CPU model. It trains into a temporary folder beside it, renamed into
# place when done, so a half-written model is never used (tools/train_demo_model.py also writes
# train_report.json last). tests/golden/test_train_demo_model.py still trains a small model end to
# end on every run. Then pytest tests/demo with FASTFORMER_DEMO_MODEL_DIR pointing at it: the
# split as text through fastformer-server over gRPC against the PyTorch model's predictions, and
# the CPU engine and the emulated CUDA engine (bfloat16, float16) on the whole held-out split.
DEMO_TRAIN_ARGS ?=
DEMO_MODEL_INPUTS := tools/train_demo_model.py tools/manpages_corpus.py tools/reference.py \
  tools/export_fastformer.py tools/safetensors_io.py tools/torch_blas.py tools/machine_info.py
DEMO_MODEL_KEY := $(shell tools/cache_key.sh $(foreach f,$(DEMO_MODEL_INPUTS),--file $(f)) \
  --text '$(DEMO_TRAIN_ARGS)' --packages 'python3-torch libtorch* python3-numpy libopenblas* manpages manpages-dev' \
  --machine)
DEMO_TEST_MODEL_DIR ?= $(FASTFORMER_CACHE)/demo-model/$(DEMO_MODEL_KEY)

.PHONY: test-demo demo-test-model

$(DEMO_TEST_MODEL_DIR)/train_report.json: | deps
	@mkdir -p $(dir $(DEMO_TEST_MODEL_DIR))
	@exec 9>$(DEMO_TEST_MODEL_DIR).lock && flock -w 3600 9 && \
	if [ -f $@ ]; then echo "demo model: $(DEMO_TEST_MODEL_DIR) (made by another run)"; else \
	  tmp=$$(mktemp -d $(DEMO_TEST_MODEL_DIR).tmp.XXXXXX) && \
	  echo "demo model: training into $$tmp (key $(DEMO_MODEL_KEY); cached for every clone)" && \
	  $(PYTHON) tools/train_demo_model.py --out $$tmp $(DEMO_TRAIN_ARGS) && \
	  rm -rf $(DEMO_TEST_MODEL_DIR) && mv -T $$tmp $(DEMO_TEST_MODEL_DIR) || { rm -rf $$tmp; exit 1; }; \
	fi

demo-test-model: $(DEMO_TEST_MODEL_DIR)/train_report.json

test-demo: deps $(DEMO_TEST_MODEL_DIR)/train_report.json
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=$(SERVER) \
	  -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j$(JOBS) --target fastformer-encode fastformer-server fastformer_emulated_encode
	FASTFORMER_BIN_DIR=$(abspath $(BUILD_DIR))/bin FASTFORMER_DEMO_MODEL_DIR=$(abspath $(DEMO_TEST_MODEL_DIR)) \
	  $(PYTHON) -m pytest tests/demo -q
