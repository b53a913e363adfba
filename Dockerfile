# Fastformer Serving image, multi-stage: the builder compiles with the same CMake commands
# as CI (`make build`, only the shipped programs), the runtime stage holds only the binaries and
# their runtime libraries. docs/deploy.md ("Images") describes both flavours.
#
# CUDA image (the defaults: NVIDIA CUDA 13 on Ubuntu 24.04, kernels for sm_80, sm_90, sm_100):
#   docker build -t fastformer-serving:cuda .
#   docker run --gpus all -p 50051:50051 -p 8000:8000 -p 8002:8002 -v $PWD/models/demo:/models:ro fastformer-serving:cuda
# CPU image (Debian 12), from this same file:
#   docker build --build-arg BUILD_IMAGE=debian:bookworm --build-arg RUNTIME_IMAGE=debian:bookworm-slim \
#                --build-arg FASTFORMER_CUDA=OFF -t fastformer-serving:cpu .
#
# Every server flag is also an environment variable (--max-batch-tokens is
# FASTFORMER_MAX_BATCH_TOKENS, see `fastformer-server --help`): `docker run -e ...`.
# `make image-test` builds the CPU image with buildah and runs it (deploy/image-test.sh).
ARG BUILD_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG FASTFORMER_CUDA=ON
ARG CUDA_ARCHS="80;90;100"
WORKDIR /src
# The dependency layer first: it survives source edits in a layer-caching builder.
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh --build
COPY . .
# Only what the image ships (not the benchmarks' and tests' helpers): the five programs and,
# in CUDA builds, the engine plugin. The configure line is the host's Release build's (`make
# build`: warnings are errors, Ninja, ccache), so a compiler cache bind-mounted at /ccache serves
# this build from the host's compiles (`buildah bud -v /var/cache/fastformer/ccache:/ccache`, as
# deploy/image-test.sh does; `docker build` has no bind mounts and compiles everything).
RUN if [ -d /ccache ] && [ -w /ccache ]; then cache="-DFASTFORMER_CCACHE_DIR=/ccache"; \
    else cache="-DFASTFORMER_CCACHE=OFF"; fi \
 && if command -v ninja >/dev/null; then export CMAKE_GENERATOR=Ninja; fi \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=ON -DFASTFORMER_WERROR=ON \
      -DFASTFORMER_TESTS=OFF $cache \
      -DFASTFORMER_CUDA="${FASTFORMER_CUDA}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
 && targets="fastformer-server fastformer-client fastformer-encode fastformer-bench fastformer-loadgen" \
 && if [ "${FASTFORMER_CUDA}" = ON ]; then targets="$targets fastformer_cuda_engine"; fi \
 && cmake --build build -j"$(nproc)" --target $targets \
 && mkdir -p /out/bin /out/lib \
 && for exe in fastformer-server fastformer-client fastformer-encode fastformer-bench fastformer-loadgen; do \
      install -m 0755 -s "build/bin/$exe" /out/bin/ || exit 1; \
    done \
 && if [ "${FASTFORMER_CUDA}" = ON ]; then \
      install -m 0644 -s build/lib/libfastformer_cuda_engine.so /out/lib/ || exit 1; \
    fi

FROM ${RUNTIME_IMAGE} AS runtime
COPY deploy/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fastformer \
 && mkdir -p /models
COPY --from=build /out/bin/ /usr/local/bin/
# The CUDA engine plugin (CUDA builds only): the server dlopens it from <exe dir>/../lib.
COPY --from=build /out/lib/ /usr/local/lib/
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
