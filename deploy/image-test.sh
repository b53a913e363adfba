#!/usr/bin/env bash
# make image-test: the CPU container image, built from the real Dockerfile and run, with no
# container engine and no registry (CI has neither). Needs root, buildah and debootstrap
# (deploy/install-deps.sh) and a python3 that imports torch (for the demo model).
#
#  1. base: a debian:bookworm minbase root filesystem made with debootstrap (what the official
#     debian images are), imported into buildah's storage as
#     localhost/fastformer-image-test/debian:bookworm-<key>. Cached between runs under
#     $FASTFORMER_IMAGE_TEST_CACHE (/var/cache/fastformer-image-test); the key hashes the
#     recipe, the mirror and the debootstrap version, and a base older than 30 days is rebuilt.
#  2. build: `buildah bud --isolation chroot` of ./Dockerfile with FASTFORMER_CUDA=OFF and that
#     base as BUILD_IMAGE and RUNTIME_IMAGE (standing in for debian:bookworm and
#     debian:bookworm-slim, which cannot be pulled here).
#  3. config: non-root USER, ENTRYPOINT fastformer-server, EXPOSE 50051 8002, VOLUME /models,
#     HEALTHCHECK with fastformer-client health; every binary's libraries resolve; no compiler.
#  4. run: the image's entry point under `buildah run` on loopback (host network), a tiny demo
#     model mounted read-only at /models; the image's HEALTHCHECK command until SERVING; an
#     Encode with the image's fastformer-client, compared with the image's fastformer-encode
#     (and the host's build/bin one when present) on the same model and input; /metrics
#     scraped before and after (fastformer_requests_total must grow); the server process runs
#     as a non-root uid; SIGTERM stops it cleanly.
#  5. the CUDA image: SKIPPED, said plainly (nvidia/cuda base images are not reachable).
#
# Environment: PYTHON (python3 with torch), FASTFORMER_BIN_DIR (host binaries, optional),
# FASTFORMER_IMAGE_TEST_CACHE, FASTFORMER_DEBIAN_MIRROR, FASTFORMER_IMAGE_TEST_KEEP=1 (keep
# the built image and the work directory), FASTFORMER_IMAGE_TEST_IMAGE=<kept image> (skip the
# build and test that image: for working on this script, never in CI).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PYTHON=${PYTHON:-/usr/bin/python3}
BIN_DIR=${FASTFORMER_BIN_DIR:-$ROOT/build/bin}
CACHE=${FASTFORMER_IMAGE_TEST_CACHE:-/var/cache/fastformer-image-test}
# The compiler cache of the host builds (mk/cache.mk), bind-mounted into the image's build.
CCACHE_HOST_DIR=${FASTFORMER_CCACHE_DIR:-${FASTFORMER_CACHE:-/var/cache/fastformer}/ccache}
MIRROR=${FASTFORMER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${FASTFORMER_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
BASE_MAX_AGE_DAYS=30
BASE_REPO=localhost/fastformer-image-test/debian
IMAGE=localhost/fastformer-serving:image-test-$$
CTR=fastformer-image-test-$$
CUDA_SKIP="image-test: CUDA image SKIPPED: nvidia/cuda base images are not reachable from this machine (no registry); it differs from the CPU image only in build args (BUILD_IMAGE, RUNTIME_IMAGE, FASTFORMER_CUDA=ON), and it was not built or run here"

log() { echo "image-test: $*"; }
fail() {
  echo "image-test: FAILED: $*" >&2
  exit 1
}
trap 'fail "line $LINENO: command exited with status $?: $BASH_COMMAND"' ERR

# ---- preconditions -----------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || fail "needs root (buildah with chroot isolation, debootstrap); CI runs as root"
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || fail "$tool is not installed: run deploy/install-deps.sh"
done
"$PYTHON" -c 'import torch' 2>/dev/null || fail "$PYTHON cannot import torch (needed for the demo model): run deploy/install-deps.sh"
log "$(buildah --version); $(debootstrap --version)"

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock -w 3600 9 || fail "another image-test holds $CACHE/lock"
WORK=$(mktemp -d /tmp/fastformer-image-test.XXXXXX)
chmod 0755 "$WORK"

# ---- storage: overlay when this kernel and filesystem allow it, else vfs ------------------
# One storage root per driver: containers/storage refuses to reopen a root with another driver.
buildah_in() {
  local driver=$1
  shift
  buildah --root "$CACHE/storage-$driver" --runroot "/run/fastformer-image-test/$driver" \
    --storage-driver "$driver" "$@"
}
storage_works() {
  local driver=$1 probe="fastformer-image-test-probe-$$"
  buildah_in "$driver" from --name "$probe" scratch >/dev/null 2>"$WORK/probe-$driver.err" || return 1
  local ok=0
  buildah_in "$driver" mount "$probe" >/dev/null 2>>"$WORK/probe-$driver.err" || ok=1
  buildah_in "$driver" umount "$probe" >/dev/null 2>&1 || true
  buildah_in "$driver" rm "$probe" >/dev/null 2>&1 || true
  return "$ok"
}
if storage_works overlay; then
  DRIVER=overlay
elif storage_works vfs; then
  DRIVER=vfs
  log "overlay storage does not work here ($(tr '\n' ' ' <"$WORK/probe-overlay.err")); using vfs (slower, more disk)"
else
  fail "buildah cannot create a container with overlay or vfs storage: $(cat "$WORK"/probe-*.err)"
fi
B() { buildah_in "$DRIVER" "$@"; }
log "buildah storage: $CACHE/storage-$DRIVER ($DRIVER)"

# ---- cleanup: only what this run started ---------------------------------------------------
SERVER_RUN_PID=""
descendants() {  # every process below $1 (one /proc snapshot), children first
  local -A children=()
  local pid ppid
  while read -r pid ppid; do
    children[$ppid]+=" $pid"
  done < <(awk '/^Pid:/ {pid = $2} /^PPid:/ {print pid, $2}' /proc/[0-9]*/status 2>/dev/null || true)
  local queue=("$1") out=()
  while [ "${#queue[@]}" -gt 0 ]; do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    for child in ${children[$pid]:-}; do
      queue+=("$child")
      out=("$child" "${out[@]}")
    done
  done
  echo "${out[@]}"
}
stop_server() {
  [ -n "$SERVER_RUN_PID" ] || return 0
  local pids
  read -ra pids <<<"$(descendants "$SERVER_RUN_PID") $SERVER_RUN_PID"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$SERVER_RUN_PID" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait "$SERVER_RUN_PID" 2>/dev/null || true
  SERVER_RUN_PID=""
}
cleanup() {
  local rc=$?
  trap - ERR
  set +e
  stop_server
  B rm "$CTR" >/dev/null 2>&1
  if [ "${FASTFORMER_IMAGE_TEST_KEEP:-0}" = 1 ]; then
    log "kept the image $IMAGE and the work directory $WORK"
  else
    B rmi "$IMAGE" >/dev/null 2>&1
    rm -rf "$WORK"
  fi
  # An image-test that fails still says what it could not cover.
  [ "$rc" -eq 0 ] || echo "$CUDA_SKIP"
  exit "$rc"
}
trap cleanup EXIT

# ---- 1. the base image -----------------------------------------------------------------------
# debian:bookworm as the official image is made: a minbase debootstrap, the deb822 sources of
# bookworm, bookworm-updates and bookworm-security, no package lists, empty resolv.conf.
make_base_rootfs() {
  local rootfs=$1
  debootstrap --variant=minbase --arch=amd64 "$SUITE" "$rootfs" "$MIRROR"
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
  : >"$rootfs/etc/resolv.conf"
  echo localhost >"$rootfs/etc/hostname"
}
base_key=$({ declare -f make_base_rootfs; echo "$SUITE $MIRROR $SECURITY_MIRROR"; debootstrap --version; } |
  sha256sum | cut -c1-12)
BASE=$BASE_REPO:$SUITE-$base_key
stamp=$CACHE/base-$base_key.stamp
if B inspect --type image "$BASE" >/dev/null 2>&1 && [ -f "$stamp" ] &&
  [ -z "$(find "$stamp" -mtime +"$BASE_MAX_AGE_DAYS")" ]; then
  log "base: $BASE (cached, made $(date -u -r "$stamp" +%F))"
else
  log "base: debootstrap $SUITE minbase from $MIRROR into $BASE ..."
  t0=$SECONDS
  rootfs=$CACHE/rootfs-$base_key
  rm -rf "$rootfs"
  make_base_rootfs "$rootfs" >"$WORK/debootstrap.log" 2>&1 ||
    fail "debootstrap failed; last lines of its log:
$(tail -n 30 "$WORK/debootstrap.log")"
  # debootstrap can leave /proc mounted in the target when interrupted.
  if mountpoint -q "$rootfs/proc"; then umount "$rootfs/proc"; fi
  B rmi "$BASE" >/dev/null 2>&1 || true
  base_ctr=$(B from scratch)
  base_mnt=$(B mount "$base_ctr")
  tar -C "$rootfs" --numeric-owner --xattrs -cf - . | tar -C "$base_mnt" --numeric-owner --xattrs -xpf -
  B umount "$base_ctr" >/dev/null
  B config --os linux --arch amd64 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label org.opencontainers.image.description="debian:$SUITE minbase, debootstrapped by deploy/image-test.sh" \
    "$base_ctr"
  B commit --quiet --rm "$base_ctr" "$BASE" >/dev/null
  rm -rf "$rootfs"
  touch "$stamp"
  # Older bases (another key) are stale: drop them.
  for old in $(B images --format '{{.Name}}:{{.Tag}}' | grep "^$BASE_REPO:" | grep -vx "$BASE" || true); do
    B rmi "$old" >/dev/null 2>&1 || true
  done
  find "$CACHE" -maxdepth 1 -name 'base-*.stamp' ! -name "base-$base_key.stamp" -delete
  log "base: made in $((SECONDS - t0)) s"
fi

# ---- 2. the CPU image from the real Dockerfile ---------------------------------------------
if [ -n "${FASTFORMER_IMAGE_TEST_IMAGE:-}" ]; then
  IMAGE=$FASTFORMER_IMAGE_TEST_IMAGE
  FASTFORMER_IMAGE_TEST_KEEP=1
  build_s=0
  log "build: SKIPPED, testing the existing image $IMAGE (FASTFORMER_IMAGE_TEST_IMAGE; not for CI)"
else
  log "build: buildah bud --isolation chroot --format docker -f Dockerfile (FASTFORMER_CUDA=OFF; BUILD_IMAGE and RUNTIME_IMAGE = $BASE, standing in for debian:bookworm and debian:bookworm-slim) ..."
  t0=$SECONDS
  set +e
  # --layers: the apt stages (install-deps.sh --build and --runtime) are cached in $CACHE's
  # storage and rebuilt only when install-deps.sh or the base changes. The host's compiler cache
  # is bind-mounted at /ccache, where the Dockerfile's build finds it (same configure line as
  # make build, so its compiles hit the host's).
  ccache_mount=()
  if [ -d "$CCACHE_HOST_DIR" ]; then ccache_mount=(-v "$CCACHE_HOST_DIR:/ccache"); fi
  B bud --isolation chroot --network host --format docker --pull=never --layers "${ccache_mount[@]}" \
    --build-arg BUILD_IMAGE="$BASE" --build-arg RUNTIME_IMAGE="$BASE" --build-arg FASTFORMER_CUDA=OFF \
    -f Dockerfile -t "$IMAGE" . 2>&1 | tee "$WORK/build.log"
  build_rc=${PIPESTATUS[0]}
  set -e
  [ "$build_rc" -eq 0 ] || fail "buildah bud exited with status $build_rc (log above)"
  build_s=$((SECONDS - t0))
  image_size=$(B images --format '{{.Size}}' "$IMAGE" | head -n 1)
  log "build: $IMAGE built in $build_s s, $image_size"
  # The layer cache keeps every step's image; those from `COPY . .` on (the builder's) and from
  # `COPY --from=build` on (the runtime's) hold this tree's sources and binaries, 1.4 GB a tree.
  # Only the newest run's are kept: the apt layers before them stay cached, the storage stops
  # growing with each commit tested.
  awk '/^\[1\/2\] STEP [0-9\/]+: COPY \. \./ || /^\[2\/2\] STEP [0-9\/]+: COPY --from=/ {keep = 1}
       /^\[[0-9]\/[0-9]\] STEP 1\// {keep = 0}
       keep && /^--> [0-9a-f]+/ {print $2}' "$WORK/build.log" | sort -u >"$WORK/source-layers"
  if [ -f "$CACHE/source-layers" ]; then
    comm -23 "$CACHE/source-layers" "$WORK/source-layers" | while read -r old_layer; do
      B rmi -f "$old_layer" >/dev/null 2>&1 || true
    done
  fi
  cp "$WORK/source-layers" "$CACHE/source-layers"
  log "build: layer cache: $(B images --all --quiet | wc -l) images in $CACHE (the apt layers, this tree's $(wc -l <"$WORK/source-layers") source layers)"
fi

# ---- 3. the image config ---------------------------------------------------------------------
B inspect --type image "$IMAGE" >"$WORK/inspect.json"
"$PYTHON" - "$WORK/inspect.json" "$WORK/healthcheck.sh" "$WORK/entrypoint" <<'EOF'
import json, sys

inspect = json.load(open(sys.argv[1]))
config = inspect["Docker"]["config"]
errors = []
user = config.get("User") or ""
if user.split(":")[0] in ("", "0", "root"):
    errors.append(f"USER is {user!r}: the image must not run as root")
entrypoint = config.get("Entrypoint") or []
if not entrypoint or entrypoint[0] != "fastformer-server":
    errors.append(f"ENTRYPOINT is {entrypoint!r}, expected fastformer-server")
ports = set((config.get("ExposedPorts") or {}).keys())
for port in ("50051/tcp", "8002/tcp"):
    if port not in ports:
        errors.append(f"EXPOSE lacks {port} (has {sorted(ports)})")
if "/models" not in (config.get("Volumes") or {}):
    errors.append(f"VOLUME lacks /models (has {config.get('Volumes')})")
env = dict(e.split("=", 1) for e in config.get("Env") or [])
if env.get("FASTFORMER_MODEL_DIR") != "/models":
    errors.append(f"FASTFORMER_MODEL_DIR is {env.get('FASTFORMER_MODEL_DIR')!r}, expected /models")
health = (config.get("Healthcheck") or {}).get("Test") or []
if len(health) < 2 or health[0] not in ("CMD", "CMD-SHELL") or "fastformer-client health" not in " ".join(health[1:]):
    errors.append(f"HEALTHCHECK is {health!r}, expected fastformer-client health")
if errors:
    sys.exit("image config: " + "; ".join(errors))
with open(sys.argv[2], "w") as f:  # the HEALTHCHECK command, as the engine would run it
    f.write(health[1] if health[0] == "CMD-SHELL" else " ".join(json.dumps(a) for a in health[1:]))
with open(sys.argv[3], "w") as f:
    f.write("\n".join(entrypoint + (config.get("Cmd") or [])))
print(f"image-test: config: USER {user}, ENTRYPOINT {entrypoint}, EXPOSE {sorted(ports)}, "
      f"VOLUME /models, HEALTHCHECK {health[0]} {' '.join(health[1:])}")
EOF

B from --pull=never --name "$CTR" "$IMAGE" >/dev/null
# buildah run mounts an anonymous volume over each VOLUME of the container's config, after
# (so hiding) the -v bind mounts: drop /models from this working container's config only.
# The image keeps its VOLUME (checked above).
B config --volume /models- "$CTR"
# R: run a command in the image's container as the image's user, on the host network.
R() { B run --isolation chroot --network host "$@"; }

uid=$(R "$CTR" -- id -u)
[ "$uid" != 0 ] || fail "commands in the image run as root"
missing_libs=$(R "$CTR" -- sh -c 'ldd /usr/local/bin/fastformer-* | grep "not found" || true')
[ -z "$missing_libs" ] || fail "runtime libraries missing in the image (deploy/install-deps.sh --runtime): $missing_libs"
toolchain=$(R "$CTR" -- sh -c 'command -v cc c++ gcc cmake nvcc || true')
[ -z "$toolchain" ] || fail "the runtime image holds build tools: $toolchain"
log "run: commands run as uid $uid; every binary's shared libraries resolve; no compiler in the image"

# ---- 4. the server inside the image ----------------------------------------------------------
MODEL=$WORK/model
IO=$WORK/io
mkdir -p "$IO"
"$PYTHON" tools/make_demo_model.py --preset tiny --seed 1 --out "$MODEL" >"$WORK/model.log" 2>&1 ||
  fail "tools/make_demo_model.py failed: $(cat "$WORK/model.log")"
"$PYTHON" - "$MODEL/config.json" "$IO/input.jsonl" <<'EOF'
import json, random, sys

vocab = json.load(open(sys.argv[1]))["vocab_size"]
rng = random.Random(6)
with open(sys.argv[2], "w") as f:
    for length in (1, 7, 64, 300):
        f.write(json.dumps({"token_ids": [rng.randrange(1, vocab) for _ in range(length)]}) + "\n")
EOF
chmod -R a+rX "$MODEL" "$IO"

read -r GRPC_PORT METRICS_PORT HTTP_PORT < <("$PYTHON" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
# float32, here and in the offline encoders below: the answers are compared within 1e-5, a
# float32 rule (the default dtype, auto, is bfloat16 on a CPU with AVX512_BF16 or AMX).
ENV_ARGS=(-e "FASTFORMER_LISTEN=127.0.0.1:$GRPC_PORT" -e "FASTFORMER_METRICS_LISTEN=127.0.0.1:$METRICS_PORT"
  -e "FASTFORMER_HTTP_LISTEN=127.0.0.1:$HTTP_PORT" -e "FASTFORMER_DTYPE=float32")
mapfile -t entrypoint <"$WORK/entrypoint"
log "run: ${entrypoint[*]} (image entry point) with /models = demo model (tiny), gRPC 127.0.0.1:$GRPC_PORT, metrics 127.0.0.1:$METRICS_PORT"
R "${ENV_ARGS[@]}" -v "$MODEL:/models:ro" "$CTR" -- "${entrypoint[@]}" >"$WORK/server.log" 2>&1 &
SERVER_RUN_PID=$!

healthcheck=$(cat "$WORK/healthcheck.sh")
t0=$SECONDS
until R "${ENV_ARGS[@]}" "$CTR" -- /bin/sh -c "$healthcheck" >"$WORK/health.out" 2>&1; do
  kill -0 "$SERVER_RUN_PID" 2>/dev/null || fail "the server exited before it was healthy; its log:
$(cat "$WORK/server.log")"
  [ $((SECONDS - t0)) -lt 120 ] || fail "no SERVING from the HEALTHCHECK command within 120 s: $(cat "$WORK/health.out"); server log:
$(cat "$WORK/server.log")"
  sleep 1
done
grep -q SERVING "$WORK/health.out" || fail "HEALTHCHECK command succeeded without printing SERVING: $(cat "$WORK/health.out")"
log "run: HEALTHCHECK command ($healthcheck) says SERVING after $((SECONDS - t0)) s"

# The HTTP listener (its runtime libraries are in the image): TEI's /health and one /embed.
"$PYTHON" - "$HTTP_PORT" <<'EOF' || fail "the image's HTTP listener did not answer /health and /embed (server log: $WORK/server.log)"
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
assert urllib.request.urlopen(base + "/health", timeout=10).status == 200
req = urllib.request.Request(base + "/embed", data=json.dumps({"inputs": [[5, 6, 7]]}).encode(),
                             headers={"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=30))
assert len(out) == 1 and len(out[0]) > 0 and all(isinstance(x, float) for x in out[0]), out
EOF
log "run: HTTP /health 200 and /embed answered on port $HTTP_PORT"

server_pid=""
for pid in $(descendants "$SERVER_RUN_PID"); do
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = fastformer-serv ]; then server_pid=$pid; fi
done
[ -n "$server_pid" ] || fail "cannot find the fastformer-server process under buildah run (pid $SERVER_RUN_PID)"
server_uid=$(awk '/^Uid:/ {print $2}' "/proc/$server_pid/status")
[ "$server_uid" != 0 ] || fail "fastformer-server runs as root in the image"

scrape() {
  "$PYTHON" - "http://127.0.0.1:$METRICS_PORT/metrics" <<'EOF'
import sys, urllib.request

text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
total = 0.0
for line in text.splitlines():
    if line.startswith("fastformer_requests_total"):
        total += float(line.rsplit(" ", 1)[1])
print(int(total))
EOF
}
requests_before=$(scrape)

R "${ENV_ARGS[@]}" -v "$IO:/io:ro" "$CTR" -- fastformer-client encode --target "127.0.0.1:$GRPC_PORT" \
  --input /io/input.jsonl --return-token-embeddings >"$WORK/served.jsonl" 2>"$WORK/client.log" ||
  fail "fastformer-client encode failed: $(cat "$WORK/client.log")"
R -v "$MODEL:/models:ro" -v "$IO:/io:ro" "$CTR" -- fastformer-encode --backend cpu --dtype float32 \
  --input /io/input.jsonl --return-token-embeddings >"$WORK/offline.jsonl" 2>"$WORK/encode.log" ||
  fail "fastformer-encode in the image failed: $(cat "$WORK/encode.log")"
compare() {
  "$PYTHON" - "$@" <<'EOF'
import json, sys

served_path, offline_path, what = sys.argv[1:4]
served = [json.loads(line) for line in open(served_path)]
offline = [json.loads(line) for line in open(offline_path)]
if len(served) != len(offline) or not served:
    sys.exit(f"{len(served)} served answers, {len(offline)} from {what}")
worst = 0.0
count = 0
def walk(a, b, where):
    global worst, count
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            sys.exit(f"{where}: shapes differ between the server and {what}")
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        diff = abs(a - b)
        worst = max(worst, diff)
        count += 1
        if diff > 1e-5 + 1e-5 * abs(b):
            sys.exit(f"{where}: server {a} vs {what} {b}")
    elif a != b:
        sys.exit(f"{where}: server {a!r} vs {what} {b!r}")
for i, (s, o) in enumerate(zip(served, offline)):
    for key in ("embedding", "token_embeddings", "num_tokens"):
        if key not in s or key not in o:
            sys.exit(f"sequence {i}: {key!r} missing (server has {sorted(s)}, {what} {sorted(o)})")
        walk(s[key], o[key], f"sequence {i} {key}")
print(f"image-test: encode: {len(served)} sequences, {count} numbers equal to {what} (max |diff| {worst:.3g})")
EOF
}
compare "$WORK/served.jsonl" "$WORK/offline.jsonl" "the image's fastformer-encode" ||
  fail "the server's answer differs from the offline encoder in the image"
if [ -x "$BIN_DIR/fastformer-encode" ]; then
  "$BIN_DIR/fastformer-encode" --model-dir "$MODEL" --backend cpu --dtype float32 --input "$IO/input.jsonl" \
    --return-token-embeddings >"$WORK/host.jsonl" 2>"$WORK/host-encode.log" ||
    fail "$BIN_DIR/fastformer-encode failed: $(cat "$WORK/host-encode.log")"
  compare "$WORK/served.jsonl" "$WORK/host.jsonl" "the host's $BIN_DIR/fastformer-encode" ||
    fail "the server in the image differs from the host build's offline encoder"
else
  log "encode: no host build at $BIN_DIR: compared with the image's offline encoder only"
fi

requests_after=$(scrape)
[ "$requests_after" -gt "$requests_before" ] ||
  fail "fastformer_requests_total did not grow on /metrics ($requests_before -> $requests_after)"
log "metrics: fastformer_requests_total $requests_before -> $requests_after on http://127.0.0.1:$METRICS_PORT/metrics"

kill -TERM "$server_pid"
t0=$SECONDS
server_rc=0
wait "$SERVER_RUN_PID" || server_rc=$?
SERVER_RUN_PID=""
[ "$server_rc" -eq 0 ] || fail "fastformer-server exited with status $server_rc after SIGTERM; its log:
$(tail -n 20 "$WORK/server.log")"
log "run: fastformer-server (uid $server_uid, pid $server_pid) stopped cleanly on SIGTERM in $((SECONDS - t0)) s"

# ---- 5. what this test cannot cover --------------------------------------------------------------
echo "$CUDA_SKIP"
if [ -n "${FASTFORMER_IMAGE_TEST_IMAGE:-}" ]; then
  log "PASSED for the existing image $IMAGE (not rebuilt: FASTFORMER_IMAGE_TEST_IMAGE); total $SECONDS s"
else
  log "PASSED: the CPU image (Dockerfile with FASTFORMER_CUDA=OFF on a debootstrapped debian:$SUITE) builds, runs as uid $uid and serves the same embeddings as the offline encoder; build $build_s s, total $SECONDS s"
fi
