# The tests on the trained demo model (tests/demo; issue 15, point 5). The model is trained
# once into DEMO_TEST_MODEL_DIR by tools/train_demo_model.py (~3 minutes on 2 cores) and kept:
# train_report.json, the trainer's last file, marks a finished run. Then pytest tests/demo
# with FASTFORMER_DEMO_MODEL_DIR pointing at it: the split as text through fastformer-server
# over gRPC against the PyTorch model's predictions, and the CPU engine and the emulated CUDA
# engine (bfloat16, float16) on the whole held-out split (a few minutes more).
DEMO_TEST_MODEL_DIR ?= $(BUILD_DIR)/demo-model

.PHONY: test-demo

$(DEMO_TEST_MODEL_DIR)/train_report.json: | deps
	$(PYTHON) tools/train_demo_model.py --out $(DEMO_TEST_MODEL_DIR)

test-demo: deps $(DEMO_TEST_MODEL_DIR)/train_report.json
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=$(SERVER) \
	  -DFASTFORMER_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j$(JOBS) --target fastformer-encode fastformer-server fastformer_emulated_encode
	FASTFORMER_BIN_DIR=$(abspath $(BUILD_DIR))/bin FASTFORMER_DEMO_MODEL_DIR=$(abspath $(DEMO_TEST_MODEL_DIR)) \
	  $(PYTHON) -m pytest tests/demo -q
