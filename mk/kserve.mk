# The Open Inference Protocol (KServe v2) service against Triton's own clients (tests/kserve).
#
#   make test-kserve   tritonclient (sync, async, streaming) and perf_analyzer against the real
#                      server on loopback; part of `make test`
#
# Triton's clients come from PyPI into $(TRITON_VENV) (mk/cache.mk: a venv outside the checkout
# over Debian's Python, whose PyTorch gives the float64 reference; the venv's own grpcio and
# protobuf come first; pins in tests/requirements/pins.txt):
#   - tritonclient[grpc,http], the Python client;
#   - perf_analyzer, Triton's C++ load tester, from an older tritonclient wheel
#     (tools/perf_analyzer_from_wheel.sh), with the CUDA runtime library it links
#     (nvidia-cuda-runtime-cu12; no GPU is used) and Debian's libb64-0d (deploy/install-deps.sh).
.PHONY: test-kserve kserve-venv

kserve-venv: $(TRITON_VENV)/.complete

test-kserve: $(TRITON_VENV)/.complete
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin $(TRITON_VENV)/bin/python -m pytest tests/kserve -q
