# The paper's efficiency claim (tools/bench_paper_claim.py; its run of 2026-11-30 in
# docs/benchmarks/paper-claim.md, its row in docs/benchmarks.md).
#
#   make bench-paper   build, then one sequence of 512, 2K, 8K, 32K and 65K tokens through
#                      fastformer-bench and through a softmax-attention Transformer of the same
#                      shape (PyTorch SDPA); writes docs/images/paper-claim-cpu.{json,png} and
#                      prints the Markdown table (about 10 to 15 minutes on 2 cores)
#
# The Transformer runs under PyTorch >= 2.1 (CPU SDPA with its flash kernel, O(L) memory),
# installed from PyPI into $(TORCH2_VENV) on first use (the default Linux wheel and its CUDA
# wheels: about 3 GB to download, 5.4 GB installed; only the CPU is used). Debian's PyTorch
# 1.13 has no SDPA: `make bench-paper TORCH2_PYTHON=/usr/bin/python3` runs "math" attention
# instead, and skips the lengths whose L x L scores would not fit.
.PHONY: bench-paper

TORCH2_VENV ?= .venv-torch2
TORCH2_VERSION ?= 2.15.0
TORCH2_PYTHON ?= $(TORCH2_VENV)/bin/python
PAPER_ARGS ?=

$(TORCH2_VENV)/.installed:
	/usr/bin/python3 -m venv $(TORCH2_VENV)
	$(TORCH2_VENV)/bin/pip install torch==$(TORCH2_VERSION) numpy
	touch $@

bench-paper: build $(if $(filter $(TORCH2_VENV)/bin/python,$(TORCH2_PYTHON)),$(TORCH2_VENV)/.installed)
	$(PYTHON) tools/bench_paper_claim.py --build-dir $(BUILD_DIR) --torch-python $(TORCH2_PYTHON) $(PAPER_ARGS)
