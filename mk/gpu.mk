# The GPU check's dress rehearsal (tests/rehearsal, issue 21): .deps packed, the tree copied and
# built with tests/gpu/gpu-check.sh's configure line and the system's /usr hidden (as on a lent
# GPU machine, which has no -dev packages), every library of the check's targets resolved inside
# .deps, the CUDA toolkit or the C/C++ runtime, then gpu-check.sh run whole in the copy with a
# fake nvidia-smi. Skipped, with the reason, where there is no nvcc or cuBLASLt header.
# Issue 47 adds the carried server: `deploy/carry-gpu-deps.sh --server` (the shipped programs for
# sm_90 with their shared-library closure, within 48 MiB in all) and `--server --check` (loaded
# from a moved copy with the system's library directories hidden), and gpu-check.sh's server
# stages run on it. PYTHON (the python3 that imports torch) makes the expected outputs and models.
.PHONY: test-gpu-rehearsal carry-gpu-server

test-gpu-rehearsal:
	@test -n "$(PYTHON)" || { echo "no python3 that imports torch: run deploy/install-deps.sh"; exit 1; }
	PYTHON=$(PYTHON) FASTFORMER_CACHE=$(FASTFORMER_CACHE) $(PYTHON) -m pytest tests/rehearsal -q -rs

# What a developer runs before a device call: .deps with the server carried, and its check.
carry-gpu-server:
	PYTHON=$(PYTHON) FASTFORMER_CACHE=$(FASTFORMER_CACHE) deploy/carry-gpu-deps.sh --server
	PYTHON=$(PYTHON) FASTFORMER_CACHE=$(FASTFORMER_CACHE) deploy/carry-gpu-deps.sh --server --check
