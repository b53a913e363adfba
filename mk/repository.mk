# The model repository (issue 25) against Triton's own clients (tests/repository).
#
#   make test-repository   the real server on a --model-repository on loopback: index, load and
#                          unload in each control mode (gRPC and REST), two models and two versions
#                          at once against their float64 references, ten hot swaps under
#                          fastformer-loadgen at 80% of saturation, unload in flight, broken
#                          versions, poll mode and SIGHUP, fairness between models, routing in
#                          every protocol, per-model metrics; part of `make test`
#
# Both of Triton's Python clients in one interpreter: $(TRITON_VENV) (mk/cache.mk:
# tritonclient[grpc,http]). The hot-swap test writes its figures to $(REPOSITORY_SWAP_REPORT) as JSON.
.PHONY: test-repository repository-venv

REPOSITORY_SWAP_REPORT ?= $(BUILD_DIR)/repository-swap.json

repository-venv: $(TRITON_VENV)/.complete

test-repository: $(TRITON_VENV)/.complete
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin FASTFORMER_SWAP_REPORT=$(CURDIR)/$(REPOSITORY_SWAP_REPORT) \
	  $(TRITON_VENV)/bin/python -m pytest tests/repository -q -rs
