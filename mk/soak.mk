# The soak test (tools/soak.py, docs/reliability.md "Soak").
#
#   make soak SOAK_SECONDS=N   build, make the demo model, start build/bin/fastformer-server on
#                              it, measure saturation with a short closed-loop fastformer-loadgen
#                              sweep, then hold 80% of it open loop for N seconds (.ci/run: 60)
#
# Fails on an unexpected error (anything but OK and RESOURCE_EXHAUSTED), a request not
# accounted for (client and server fastformer_requests_total disagree), resident memory
# growing 5% or more after warm-up, descriptor growth, or a server that does not exit 0 on
# SIGTERM. Prints a summary table; the figures go to $(BUILD_DIR)/soak.json.
.PHONY: soak

SOAK_SECONDS ?= 60
SOAK_ARGS ?=

soak: build demo-model
	python3 tools/soak.py --bin-dir $(BUILD_DIR)/bin --model-dir $(MODEL_DIR) --seconds $(SOAK_SECONDS) \
	  --json-out $(BUILD_DIR)/soak.json $(SOAK_ARGS)
