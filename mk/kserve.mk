# The Open Inference Protocol (KServe v2) service against Triton's own clients (tests/kserve).
#
#   make test-kserve   tritonclient (sync, async, streaming) and perf_analyzer against the real
#                      server on loopback; part of `make test`
#
# Triton's clients come from PyPI into $(TRITON_VENV), a venv over Debian's Python (whose
# PyTorch gives the float64 reference; the venv's own grpcio and protobuf come first):
#   - tritonclient[grpc] $(TRITONCLIENT_VERSION), the Python client;
#   - perf_analyzer, Triton's C++ load tester, from the tritonclient $(PERF_ANALYZER_FROM) wheel (the
#     newer perf-analyzer packages do not install here), with the CUDA runtime library it links
#     (nvidia-cuda-runtime-cu12; no GPU is used) and Debian's libb64-0d (deploy/install-deps.sh).
.PHONY: test-kserve kserve-venv

TRITON_VENV ?= .venv-triton
TRITONCLIENT_VERSION ?= 2.73.0
PERF_ANALYZER_FROM ?= 2.41.0

$(TRITON_VENV)/.installed: mk/kserve.mk
	rm -rf $(TRITON_VENV)
	/usr/bin/python3 -m venv --system-site-packages $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q "tritonclient[grpc]==$(TRITONCLIENT_VERSION)" "nvidia-cuda-runtime-cu12==12.*"
	$(TRITON_VENV)/bin/pip download -q --no-deps -d $(TRITON_VENV)/wheels "tritonclient==$(PERF_ANALYZER_FROM)"
	$(TRITON_VENV)/bin/python -c "import sys, zipfile, pathlib; \
	  w = zipfile.ZipFile(next(pathlib.Path(sys.argv[1]).glob('tritonclient-*.whl'))); \
	  out = pathlib.Path(sys.argv[2]); \
	  out.write_bytes(w.read(next(n for n in w.namelist() if n.endswith('/bin/perf_analyzer')))); \
	  out.chmod(0o755)" $(TRITON_VENV)/wheels $(TRITON_VENV)/bin/perf_analyzer
	touch $@

kserve-venv: $(TRITON_VENV)/.installed

test-kserve: $(TRITON_VENV)/.installed
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin $(TRITON_VENV)/bin/python -m pytest tests/kserve -q
