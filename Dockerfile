# Fastformer Serving image, multi-stage: the builder compiles the shipped programs with the one
# configure line shared with the GPU check's carried binaries (deploy/build-binaries.sh), the
# runtime stage holds only the binaries and their runtime libraries. docs/deploy.md ("Images")
# describes the flavours.
#
# CUDA image (the default, the one CI builds and tests: `make image-test-cuda`): Debian 12, the
# CUDA 13 toolkit from NVIDIA's PyPI wheels (pinned, with hashes, in deploy/cuda-wheels.txt),
# kernels for sm_80, sm_90 and sm_100. The runtime stage adds only libcudart and libcublasLt
# (with NVIDIA's licence); the NVIDIA container toolkit injects the driver at `docker run --gpus`.
#   docker build -t fastformer-serving:cuda .
#   docker run --gpus all -p 50051:50051 -p 8000:8000 -p 8002:8002 -v $PWD/models/demo:/models:ro fastformer-serving:cuda
# CPU image (Debian 12), from this same file (`make image-test`):
#   docker build --build-arg FASTFORMER_CUDA=OFF -t fastformer-serving:cpu .
# CUDA image on NVIDIA's own base images (NOT BUILT IN CI: they cannot be pulled where CI runs):
#   docker build --build-arg BUILD_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04 \
#                --build-arg RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 \
#                --build-arg CUDA_TOOLKIT=image -t fastformer-serving:cuda-ubuntu .
#
# Every server flag is also an environment variable (--max-batch-tokens is
# FASTFORMER_MAX_BATCH_TOKENS, see `fastformer-server --help`): `docker run -e ...`.
ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
# ON: the CUDA engine plugin and the CUDA libraries; OFF: the CPU image.
ARG FASTFORMER_CUDA=ON
# Where the CUDA toolkit comes from: "wheels" (NVIDIA's PyPI wheels of deploy/cuda-wheels.txt,
# laid out under /usr/local/cuda-13.0 as a toolkit) or "image" (BUILD_IMAGE and RUNTIME_IMAGE
# already hold it: the nvidia/cuda flavour above).
ARG CUDA_TOOLKIT=wheels

# ---- cuda: NVIDIA's wheels laid out as a CUDA toolkit (empty for the CPU image) -------------
# /opt/toolkit: what the builder needs (nvcc with its crt headers, NVVM's cicc and libdevice,
# the runtime's headers and libraries, CCCL, cuBLAS's headers) at /usr/local/cuda-13.0, with
# /usr/local/cuda pointing at it, as on the machines of this project. /opt/runtime: what the
# image ships (libcudart.so.13, libcublasLt.so.13, the two wheels' dist-info with NVIDIA's
# License.txt, and the loader's path). The wheels come from a wheel cache bind-mounted at
# /cuda-wheels when it holds any (`buildah bud -v $FASTFORMER_CACHE/cuda-wheels:/cuda-wheels:ro`,
# as deploy/image-test.sh --cuda does), else from PyPI; pip checks every file's hash either way.
FROM ${BUILD_IMAGE} AS cuda
ARG FASTFORMER_CUDA
ARG CUDA_TOOLKIT
COPY deploy/cuda-wheels.txt /tmp/cuda-wheels.txt
RUN set -eu; mkdir -p /opt/toolkit /opt/runtime; \
    if [ "${FASTFORMER_CUDA}" != ON ] || [ "${CUDA_TOOLKIT}" != wheels ]; then exit 0; fi; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip ca-certificates >/dev/null; \
    source="PyPI"; from=""; \
    if ls /cuda-wheels/*.whl >/dev/null 2>&1; then source="the wheel cache"; from="--no-index --find-links /cuda-wheels"; fi; \
    echo "cuda: installing deploy/cuda-wheels.txt from $source"; \
    python3 -m pip install --quiet --no-deps --require-hashes --only-binary=:all: --no-cache-dir --no-compile \
      --disable-pip-version-check --target /opt/site $from -r /tmp/cuda-wheels.txt; \
    version=$(ls -d /opt/site/nvidia_cuda_nvcc-*.dist-info | sed 's/.*nvcc-\([0-9]*\.[0-9]*\)\..*/\1/'); \
    t=/opt/toolkit/usr/local/cuda-$version; r=/opt/runtime/usr/local/cuda-$version; \
    mkdir -p /opt/toolkit/usr/local "$r/lib" "$r/dist-info" /opt/runtime/etc/ld.so.conf.d; \
    mv /opt/site/nvidia/cu13 "$t"; \
    mkdir "$t/dist-info" && mv /opt/site/*.dist-info "$t/dist-info/" && rm -rf /opt/site; \
    cp -a "$t/lib/libcudart.so.13" "$r/lib/"; \
    mv "$t/lib/libcublasLt.so.13" "$r/lib/"; \
    rm -f "$t/lib/libcublas.so.13" "$t/lib/libnvblas.so.13"; \
    cp -a "$t"/dist-info/nvidia_cuda_runtime-*.dist-info "$t"/dist-info/nvidia_cublas-*.dist-info "$r/dist-info/"; \
    for dir in "$t/lib" "$r/lib"; do \
      for so in "$dir"/*.so.*; do ln -s "${so##*/}" "${so%%.so.*}.so"; done; \
    done; \
    ln -s lib "$t/lib64"; mkdir -p "$t/targets/x86_64-linux"; \
    ln -s ../../include "$t/targets/x86_64-linux/include"; ln -s ../../lib "$t/targets/x86_64-linux/lib"; \
    ln -s "cuda-$version" /opt/toolkit/usr/local/cuda; ln -s "cuda-$version" /opt/runtime/usr/local/cuda; \
    echo "/usr/local/cuda-$version/lib" >/opt/runtime/etc/ld.so.conf.d/zz-cuda.conf; \
    "$t/bin/nvcc" --version | tail -n 2; \
    echo "cuda: toolkit $(du -sh "$t" | cut -f1), runtime libraries $(du -sh "$r" | cut -f1)"

# ---- build: the shipped programs -------------------------------------------------------------
FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# The dependency layer first (no build arguments above it, so the CPU and CUDA builds share it):
# it survives source edits in a layer-caching builder.
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh --build
COPY --from=cuda /opt/toolkit/ /
ARG FASTFORMER_CUDA
ARG CUDA_ARCHS="80;90;100"
COPY . .
# deploy/build-binaries.sh: the five programs and, with FASTFORMER_CUDA=ON, the engine plugin,
# stripped, in /out/{bin,lib}, and its configure line in /out/configure.cmd. A compiler cache
# bind-mounted at /ccache serves this build from the host's compiles (`buildah bud -v
# /var/cache/fastformer/ccache:/ccache`, as deploy/image-test.sh does; `docker build` has no bind
# mounts and compiles everything; ccache also keys a compile on the locale, which
# build-binaries.sh pins for every caller). The build tree is dropped: only /out is kept in the
# layer.
RUN set -eu; \
    if [ -d /ccache ] && [ -w /ccache ]; then cache="-DFASTFORMER_CCACHE_DIR=/ccache"; \
    else cache="-DFASTFORMER_CCACHE=OFF"; fi; \
    cuda=""; \
    if [ "${FASTFORMER_CUDA}" = ON ] && [ -x /usr/local/cuda/bin/nvcc ]; then \
      cuda="-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"; fi; \
    FASTFORMER_CUDA="${FASTFORMER_CUDA}" CUDA_ARCHS="${CUDA_ARCHS}" deploy/build-binaries.sh build /out $cache $cuda; \
    rm -rf build

# ---- runtime: the image you run ----------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime-deps
COPY deploy/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fastformer \
 && mkdir -p /models

# FASTFORMER_CUDA=ON: libcudart.so.13 and libcublasLt.so.13 (the plugin links the first and opens
# the second with dlopen; FASTFORMER_CUBLASLT_LIBRARY names another), on the loader's path. The
# driver (libcuda.so.1) is not in the image: the NVIDIA container toolkit mounts the node's at
# `docker run --gpus ...`, as for NVIDIA's images, guided by these variables; it refuses to start
# the container on a driver older than CUDA 13 (NVIDIA_REQUIRE_CUDA), early and clearly.
FROM runtime-deps AS runtime-cuda-ON
COPY --from=cuda /opt/runtime/ /
RUN ldconfig
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"

FROM runtime-deps AS runtime-cuda-OFF

FROM runtime-cuda-${FASTFORMER_CUDA} AS runtime
COPY --from=build /out/bin/ /usr/local/bin/
# The CUDA engine plugin (CUDA builds only): the server dlopens it from <exe dir>/../lib.
COPY --from=build /out/lib/ /usr/local/lib/
# The configure line the binaries were built with (deploy/build-binaries.sh).
COPY --from=build /out/configure.cmd /usr/local/share/fastformer/configure.cmd
# The server listens on all interfaces inside the container; the port mapping decides
# what is reachable. The model is read from the /models volume.
ENV FASTFORMER_MODEL_DIR=/models \
    FASTFORMER_LISTEN=0.0.0.0:50051 \
    FASTFORMER_METRICS_LISTEN=0.0.0.0:8002 \
    FASTFORMER_HTTP_LISTEN=0.0.0.0:8000
VOLUME ["/models"]
# gRPC, HTTP (OpenAI, TEI, KServe v2 REST), /metrics.
EXPOSE 50051 8000 8002
USER 10001:10001
# grpc.health.v1 on the gRPC port this container listens on (taken from FASTFORMER_LISTEN).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD fastformer-client health --deadline-ms 4000 --target "127.0.0.1:${FASTFORMER_LISTEN##*:}" || exit 1
ENTRYPOINT ["fastformer-server"]
