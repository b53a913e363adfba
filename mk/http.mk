# The HTTP listener (OpenAI /v1/embeddings, TEI routes, KServe v2 REST) against third-party
# clients, unchanged (tests/http).
#
#   make test-http   openai, langchain-openai, llama-index's TEI embeddings, huggingface_hub,
#                    tritonclient.http, perf_analyzer (-i http), curl and raw sockets against the
#                    real server on loopback
#
# The clients come from PyPI into $(HTTP_VENV) (mk/cache.mk), a venv over Debian's Python (whose
# PyTorch and NumPy give the float64 reference), pinned in tests/requirements/pins.txt to the
# versions the suite was written against. perf_analyzer is the one in $(TRITON_VENV); the suite
# finds it through PERF_ANALYZER.
.PHONY: test-http http-venv

http-venv: $(HTTP_VENV)/.complete

test-http: $(HTTP_VENV)/.complete $(TRITON_VENV)/.complete
	FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin PERF_ANALYZER=$(TRITON_VENV)/bin/perf_analyzer \
	  $(HTTP_VENV)/bin/python -m pytest tests/http -q
