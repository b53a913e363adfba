# Fastformer Serving image, multi-stage: the builder compiles with the same commands as CI,
# the runtime stage holds only the binaries and their runtime libraries.
#
# CPU image (what this revision serves):
#   docker build --build-arg BUILD_IMAGE=debian:bookworm --build-arg RUNTIME_IMAGE=debian:bookworm-slim \
#                --build-arg FASTFORMER_CUDA=OFF -t fastformer-serving:cpu .
# The deployment issue adds the CUDA images (NVIDIA CUDA 13 base images), the gRPC server
# entry point and the health check.
ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
ARG FASTFORMER_CUDA=OFF
ARG CUDA_ARCHS="80;90;100"
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh --build
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_CUDA=${FASTFORMER_CUDA} \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" -DFASTFORMER_TESTS=OFF \
 && cmake --build build -j"$(nproc)" \
 && mkdir -p /out/lib && { cp build/lib/libfastformer_cuda_engine.so /out/lib/ 2>/dev/null || true; }

FROM ${RUNTIME_IMAGE} AS runtime
COPY deploy/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
 && useradd --system --uid 10001 --no-create-home fastformer
COPY --from=build /src/build/bin/fastformer-encode /src/build/bin/fastformer-bench /usr/local/bin/
# The CUDA engine plugin (CUDA builds only), found beside the binaries as ../lib.
COPY --from=build /out/lib/ /usr/local/lib/
USER fastformer
VOLUME ["/models"]
ENV FASTFORMER_MODEL_DIR=/models
ENTRYPOINT ["fastformer-encode"]
CMD ["--input", "-", "--output", "-"]
