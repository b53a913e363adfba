# The container image test (included by the Makefile; run by .ci/run after `make test`).
.PHONY: image-test

# Builds the CPU image from the Dockerfile with buildah on a debootstrapped debian:bookworm
# base (no registry needed), runs the server inside it on loopback, checks an Encode against
# the offline encoder, /metrics, the health check and the image config. Needs root.
# The CUDA image is reported as SKIPPED: its NVIDIA base images cannot be pulled here.
image-test: deps
	PYTHON=$(PYTHON) FASTFORMER_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin deploy/image-test.sh
