# The GPU check's dress rehearsal (tests/rehearsal, issue 21): .deps packed, the tree copied and
# built with tests/gpu/gpu-check.sh's configure line and the system's /usr hidden (as on a lent
# GPU machine, which has no -dev packages), every library of the check's targets resolved inside
# .deps, the CUDA toolkit or the C/C++ runtime, then gpu-check.sh run whole in the copy with a
# fake nvidia-smi. Skipped, with the reason, where there is no nvcc or cuBLASLt header.
.PHONY: test-gpu-rehearsal

test-gpu-rehearsal:
	@test -n "$(PYTHON)" || { echo "no python3 that imports torch: run deploy/install-deps.sh"; exit 1; }
	$(PYTHON) -m pytest tests/rehearsal -q -rs
