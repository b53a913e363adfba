# The HTTP listener (OpenAI /v1/embeddings, TEI routes, KServe v2 REST) against third-party
# clients, unchanged (tests/http).
#
#   make test-http   openai, langchain-openai, llama-index's TEI embeddings, huggingface_hub,
#                    tritonclient.http, perf_analyzer (-i http), curl and raw sockets against the
#                    real server on loopback
#
# The clients come from PyPI into $(HTTP_VENV), a venv over Debian's Python (whose PyTorch and
# NumPy give the float64 reference), pinned to the versions the suite was written against.
# perf_analyzer is the one mk/kserve.mk extracts into $(TRITON_VENV) (with the CUDA runtime
# library it links; no GPU is used); the suite finds it through PERF_ANALYZER.
.PHONY: test-http http-venv

HTTP_VENV ?= .venv-http
# as mk/kserve.mk (included after this file) sets it; needed here for the prerequisite below
TRITON_VENV ?= .venv-triton
HTTP_OPENAI_VERSION ?= 3.57.0
HTTP_LANGCHAIN_OPENAI_VERSION ?= 1.7.4
HTTP_LLAMA_INDEX_TEI_VERSION ?= 0.6.0
HTTP_HUGGINGFACE_HUB_VERSION ?= 2.4.0
HTTP_TRITONCLIENT_VERSION ?= 2.73.0

$(HTTP_VENV)/.installed: mk/http.mk
	rm -rf $(HTTP_VENV)
	/usr/bin/python3 -m venv --system-site-packages $(HTTP_VENV)
	$(HTTP_VENV)/bin/pip install -q "openai==$(HTTP_OPENAI_VERSION)" \
	  "langchain-openai==$(HTTP_LANGCHAIN_OPENAI_VERSION)" \
	  "llama-index-embeddings-text-embeddings-inference==$(HTTP_LLAMA_INDEX_TEI_VERSION)" \
	  "huggingface_hub==$(HTTP_HUGGINGFACE_HUB_VERSION)" \
	  "tritonclient[http]==$(HTTP_TRITONCLIENT_VERSION)"
	touch $@

http-venv: $(HTTP_VENV)/.installed

test-http: $(HTTP_VENV)/.installed $(TRITON_VENV)/.installed
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin PERF_ANALYZER=$(CURDIR)/$(TRITON_VENV)/bin/perf_analyzer \
	  $(HTTP_VENV)/bin/python -m pytest tests/http -q
