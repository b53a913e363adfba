# The container image tests (included by the Makefile; run by .ci/run after `make test`, CPU
# first). Both build the real Dockerfile with buildah on a debootstrapped debian:bookworm base
# (no registry, no container engine), with the host's compiler cache bind-mounted, then run the
# image on loopback. Need root. deploy/image-test.sh says what each checks; docs/deploy.md
# ("Images") what they cover and what only a GPU node can.
.PHONY: image-test image-test-cuda image-tests

# Both, one after the other (they share buildah's storage and layer cache), each its own step
# (tools/step.sh): .ci/run runs this side by side with make test-tsan (tools/side_by_side.sh).
# Neither times anything (their waits are bounds of 10 to 120 s on steps of a few seconds), and
# they keep about one core busy (133 s of CPU in 120 s) while test-tsan's ctest takes both.
image-tests:
	@tools/step.sh "make image-test" $(MAKE) --no-print-directory image-test
	@tools/step.sh "make image-test-cuda" $(MAKE) --no-print-directory image-test-cuda

# The CPU image (FASTFORMER_CUDA=OFF): config, libraries, an Encode against the offline encoder,
# /metrics, the health check, SIGTERM.
image-test: deps
	PYTHON=$(PYTHON) FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin deploy/image-test.sh

# The CUDA image (the Dockerfile's default) with no GPU: the toolkit from NVIDIA's PyPI wheels
# (deploy/cuda-wheels.txt; downloaded once into $(FASTFORMER_CACHE)/cuda-wheels), every library
# of the binaries and the plugin, cuBLASLt's version, --backend auto falling back to the CPU,
# --backend cuda refused, non-root, HEALTHCHECK, and the image's size against a budget.
# Kernels for IMAGE_TEST_CUDA_ARCHS only (default 90: the lent GPU's, so the compiles are shared
# with deploy/carry-gpu-deps.sh --server through the compiler cache); the image's own default,
# for a release build, is "80;90;100" (`make image-test-cuda IMAGE_TEST_CUDA_ARCHS="80;90;100"`).
IMAGE_TEST_CUDA_ARCHS ?= 90
image-test-cuda: deps
	PYTHON=$(PYTHON) FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin FASTFORMER_CACHE=$(FASTFORMER_CACHE) \
	  CUDA_ARCHS="$(IMAGE_TEST_CUDA_ARCHS)" deploy/image-test.sh --cuda
