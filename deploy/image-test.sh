#!/usr/bin/env bash
# make image-test / make image-test-cuda: the container images, built from the real Dockerfile and
# run, with no container engine, no registry and no GPU (CI has none of them). Needs root,
# buildah and debootstrap (deploy/install-deps.sh), a python3 that imports torch (for the demo
# model), and for --cuda pip and a C compiler.
#
#   deploy/image-test.sh          the CPU image (FASTFORMER_CUDA=OFF)
#   deploy/image-test.sh --cuda   the CUDA image (the Dockerfile's default), on no GPU
#
#  1. base: a debian:bookworm minbase root filesystem made with debootstrap (what the official
#     debian images are), imported into buildah's storage as
#     localhost/fastformer-image-test/debian:bookworm-<key>. Cached between runs under
#     $FASTFORMER_IMAGE_TEST_CACHE (/var/cache/fastformer-image-test); the key hashes the
#     recipe, the mirror and the debootstrap version, and a base older than 30 days is rebuilt.
#     Both flavours build on it and share its storage (and the Dockerfile's apt layers).
#  2. (--cuda) the wheels: deploy/cuda-wheels.txt's files, downloaded once with pip (hashes
#     checked) into $FASTFORMER_CACHE/cuda-wheels, bind-mounted into the build at /cuda-wheels.
#  3. build: `buildah bud --isolation chroot --layers` of ./Dockerfile with that base as
#     BUILD_IMAGE and RUNTIME_IMAGE (standing in for debian:bookworm and debian:bookworm-slim,
#     which cannot be pulled here), the host's compiler cache bind-mounted at /ccache;
#     FASTFORMER_CUDA=OFF, or ON with CUDA_ARCHS [90] for --cuda.
#  4. config: non-root USER, ENTRYPOINT fastformer-server, EXPOSE 50051 8002, VOLUME /models,
#     HEALTHCHECK with fastformer-client health, the NVIDIA container toolkit's variables (set
#     in the CUDA image, absent from the CPU one); every library of every binary (and of the
#     CUDA image's plugin, /usr/local/lib/libfastformer_cuda_engine.so) resolves; no compiler.
#  5. (--cuda) cuBLASLt: a probe (built here, bind-mounted, run in the image as its user) opens
#     the image's libcublasLt.so.13 and libcudart.so.13 as the engine does and prints their
#     versions and paths; the version must be deploy/cuda-wheels.txt's nvidia-cublas.
#  6. run: the image's entry point under `buildah run` on loopback (host network), a tiny demo
#     model mounted read-only at /models (with --cuda: --backend auto, which must fall back to
#     the CPU and say why in its log); the image's HEALTHCHECK command until SERVING; HTTP
#     /health and /embed; an Encode with the image's fastformer-client, compared with the
#     image's fastformer-encode (and the host's build/bin one when present) on the same model
#     and input; /metrics scraped before and after (fastformer_requests_total must grow); the
#     server process runs as a non-root uid; SIGTERM stops it cleanly.
#  7. (--cuda) `fastformer-server --backend cuda` with no GPU exits non-zero, naming the missing
#     driver or device; the image's size, piece by piece, against a budget
#     ($FASTFORMER_IMAGE_TEST_CUDA_BUDGET_MB).
#
# Environment: PYTHON (python3 with torch), FASTFORMER_BIN_DIR (host binaries, optional),
# FASTFORMER_IMAGE_TEST_CACHE, FASTFORMER_CACHE (the wheel cache's parent) and
# FASTFORMER_CCACHE_DIR, FASTFORMER_DEBIAN_MIRROR, CUDA_ARCHS (--cuda; default 90),
# FASTFORMER_IMAGE_TEST_KEEP=1 (keep the work directory; the image built is always kept, as
# localhost/fastformer-serving:image-test or :image-test-cuda in $FASTFORMER_IMAGE_TEST_CACHE's
# storage), FASTFORMER_IMAGE_TEST_IMAGE=<image> (skip the build and test that image: for
# working on this script, never in CI).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FLAVOUR=cpu
case "${1:-}" in
  "") ;;
  --cuda) FLAVOUR=cuda ;;
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  *) echo "image-test.sh: unknown option '$1' (expected --cuda or nothing)" >&2; exit 2 ;;
esac
NAME=image-test
[ "$FLAVOUR" = cpu ] || NAME=image-test-cuda

PYTHON=${PYTHON:-/usr/bin/python3}
BIN_DIR=${FASTFORMER_BIN_DIR:-$ROOT/build/bin}
CACHE=${FASTFORMER_IMAGE_TEST_CACHE:-/var/cache/fastformer-image-test}
# The compiler cache of the host builds (mk/cache.mk), bind-mounted into the image's build.
CCACHE_HOST_DIR=${FASTFORMER_CCACHE_DIR:-${FASTFORMER_CACHE:-/var/cache/fastformer}/ccache}
# deploy/cuda-wheels.txt's files, downloaded once (--cuda).
WHEELS=${FASTFORMER_CACHE:-/var/cache/fastformer}/cuda-wheels
CUDA_ARCHS=${CUDA_ARCHS:-90}
# The CUDA image: cuBLASLt alone is 542 MB; the rest (the Debian base and runtime libraries,
# the programs, the plugin, libcudart) 245 MB with kernels for sm_90 (measured 2026-12-07).
CUDA_BUDGET_MB=${FASTFORMER_IMAGE_TEST_CUDA_BUDGET_MB:-900}
MIRROR=${FASTFORMER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${FASTFORMER_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
BASE_MAX_AGE_DAYS=30
BASE_REPO=localhost/fastformer-image-test/debian
# The image built stays tagged (one per flavour) after the test: removing it would remove with it
# every layer of its runtime stages that only it uses, the apt layer of install-deps.sh --runtime
# included, and the next run would rebuild them. The next build takes the tag over.
IMAGE=localhost/fastformer-serving:$NAME
CTR=fastformer-$NAME-$$
if [ "$FLAVOUR" = cpu ]; then
  NOT_COVERED="image-test: the CUDA image is tested by make image-test-cuda (deploy/image-test.sh --cuda), not here"
else
  NOT_COVERED="image-test-cuda: NOT COVERED here (no GPU on this machine): the NVIDIA container toolkit injecting the driver (docker run --gpus) and refusing an old one (NVIDIA_REQUIRE_CUDA), and the CUDA engine serving from the image; only a GPU node can test those (docs/deploy.md)"
fi

log() { echo "$NAME: $*"; }
fail() {
  echo "$NAME: FAILED: $*" >&2
  exit 1
}
trap 'fail "line $LINENO: command exited with status $?: $BASH_COMMAND"' ERR

# ---- preconditions -----------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || fail "needs root (buildah with chroot isolation, debootstrap); CI runs as root"
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || fail "$tool is not installed: run deploy/install-deps.sh"
done
"$PYTHON" -c 'import torch' 2>/dev/null || fail "$PYTHON cannot import torch (needed for the demo model): run deploy/install-deps.sh"
if [ "$FLAVOUR" = cuda ]; then
  command -v cc >/dev/null || fail "no C compiler for the cuBLASLt probe: run deploy/install-deps.sh"
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || fail "/usr/bin/python3 has no pip (python3-pip) for the CUDA wheels"
  case "$CUDA_ARCHS" in
    "" | *[!0-9\;]*) fail "CUDA_ARCHS='$CUDA_ARCHS' is not a list of architectures like 90 or \"80;90;100\"" ;;
  esac
fi
log "$(buildah --version); $(debootstrap --version)"

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock -w 3600 9 || fail "another image-test holds $CACHE/lock"
WORK=$(mktemp -d /tmp/fastformer-$NAME.XXXXXX)
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
    log "kept the work directory $WORK (the image is $IMAGE)"
  else
    rm -rf "$WORK"
  fi
  # A test that fails still says what it could not cover.
  [ "$rc" -eq 0 ] || echo "$NOT_COVERED"
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

# ---- 2. the CUDA wheels (--cuda) ---------------------------------------------------------------
# pip download checks each file's hash (--require-hashes); a stamp keyed by the pin list skips
# even that on later runs. Wheels of older pins are removed.
if [ "$FLAVOUR" = cuda ]; then
  wheels_key=$(sha256sum deploy/cuda-wheels.txt | cut -c1-12)
  mkdir -p "$WHEELS"
  pins=$(grep -c '^[A-Za-z0-9_.-]*==' deploy/cuda-wheels.txt)
  if [ -f "$WHEELS/.complete-$wheels_key" ] && [ "$(find "$WHEELS" -maxdepth 1 -name '*.whl' | wc -l)" -eq "$pins" ]; then
    log "wheels: $WHEELS (cached for deploy/cuda-wheels.txt $wheels_key)"
  else
    log "wheels: pip download deploy/cuda-wheels.txt into $WHEELS ..."
    t0=$SECONDS
    rm -f "$WHEELS"/.complete-*
    /usr/bin/python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
      --disable-pip-version-check --dest "$WHEELS" -r deploy/cuda-wheels.txt >"$WORK/pip.log" 2>&1 ||
      fail "pip download of deploy/cuda-wheels.txt failed: $(tail -n 20 "$WORK/pip.log")"
    # name==version lines -> the wheels' file name prefixes (name_with_underscores-version-).
    mapfile -t prefixes < <(sed -n 's/^\([A-Za-z0-9_.-]*\)==\([^ ;]*\).*/\1-\2-/p' deploy/cuda-wheels.txt | tr '.-' '._' |
      sed 's/_\([0-9][0-9.]*\)_$/-\1-/')
    for whl in "$WHEELS"/*.whl; do
      base=${whl##*/}
      keep=0
      for p in "${prefixes[@]}"; do [[ "$base" == "$p"* ]] && keep=1; done
      [ "$keep" = 1 ] || { log "wheels: removing $base (not in deploy/cuda-wheels.txt)"; rm -f "$whl"; }
    done
    touch "$WHEELS/.complete-$wheels_key"
    log "wheels: $(find "$WHEELS" -name '*.whl' | wc -l) files, $(du -sh "$WHEELS" | cut -f1), in $((SECONDS - t0)) s"
  fi
fi

# ---- 3. the image from the real Dockerfile -----------------------------------------------------
if [ -n "${FASTFORMER_IMAGE_TEST_IMAGE:-}" ]; then
  IMAGE=$FASTFORMER_IMAGE_TEST_IMAGE
  FASTFORMER_IMAGE_TEST_KEEP=1
  build_s=0
  image_size=$(B images --format '{{.Size}}' "$IMAGE" | head -n 1)
  log "build: SKIPPED, testing the existing image $IMAGE (FASTFORMER_IMAGE_TEST_IMAGE; not for CI)"
else
  # FASTFORMER_CUDA is always passed: buildah 1.28 does not resolve a stage named by a
  # build argument's default (the runtime stage is FROM runtime-cuda-${FASTFORMER_CUDA}).
  args=(--build-arg BUILD_IMAGE="$BASE" --build-arg RUNTIME_IMAGE="$BASE")
  mounts=()
  if [ "$FLAVOUR" = cpu ]; then
    args+=(--build-arg FASTFORMER_CUDA=OFF)
    what="FASTFORMER_CUDA=OFF"
  else
    args+=(--build-arg FASTFORMER_CUDA=ON --build-arg CUDA_TOOLKIT=wheels --build-arg CUDA_ARCHS="$CUDA_ARCHS")
    mounts+=(-v "$WHEELS:/cuda-wheels:ro")
    what="FASTFORMER_CUDA=ON, CUDA_ARCHS=$CUDA_ARCHS, the toolkit from the wheels in $WHEELS"
  fi
  # --layers: the apt stages (install-deps.sh --build and --runtime) and the wheels' toolkit are
  # cached in $CACHE's storage and rebuilt only when install-deps.sh, deploy/cuda-wheels.txt or
  # the base changes. The host's compiler cache is bind-mounted at /ccache, where the Dockerfile's
  # build finds it (the configure line of deploy/build-binaries.sh, so its compiles hit the
  # host's: make build's, and for the CUDA files deploy/carry-gpu-deps.sh --server's).
  if [ -d "$CCACHE_HOST_DIR" ]; then mounts+=(-v "$CCACHE_HOST_DIR:/ccache"); fi
  log "build: buildah bud --isolation chroot --format docker --layers -f Dockerfile ($what; BUILD_IMAGE and RUNTIME_IMAGE = $BASE, standing in for debian:bookworm and debian:bookworm-slim) ..."
  t0=$SECONDS
  set +e
  B bud --isolation chroot --network host --format docker --pull=never --layers --force-rm "${mounts[@]}" \
    "${args[@]}" -f Dockerfile -t "$IMAGE" . 2>&1 | tee "$WORK/build.log"
  build_rc=${PIPESTATUS[0]}
  set -e
  [ "$build_rc" -eq 0 ] || fail "buildah bud exited with status $build_rc (log above)"
  build_s=$((SECONDS - t0))
  image_size=$(B images --format '{{.Size}}' "$IMAGE" | head -n 1)
  log "build: $IMAGE built in $build_s s, $image_size"
  # The layer cache keeps every step's image; those from the builder's `COPY . .` and from the
  # runtime's `COPY --from=build` on hold this tree's sources and binaries. Only the newest run's
  # are kept, for each flavour: the apt and toolkit layers before them stay cached, the storage
  # stops growing with each commit tested.
  awk '/^\[[0-9]+\/[0-9]+\] STEP [0-9]+\/[0-9]+: COPY \. \./ ||
       /^\[[0-9]+\/[0-9]+\] STEP [0-9]+\/[0-9]+: COPY --from=build / {keep = 1}
       /^\[[0-9]+\/[0-9]+\] STEP 1\// {keep = 0}
       keep && /^--> [0-9a-f]+$/ {print $2}' "$WORK/build.log" | sort -u >"$WORK/source-layers"
  layers_file=$CACHE/source-layers-$FLAVOUR
  # (one list for the CPU image before the CUDA image was tested)
  if [ "$FLAVOUR" = cpu ] && [ -f "$CACHE/source-layers" ]; then mv "$CACHE/source-layers" "$layers_file"; fi
  if [ -f "$layers_file" ]; then
    comm -23 "$layers_file" "$WORK/source-layers" | while read -r old_layer; do
      B rmi -f "$old_layer" >/dev/null 2>&1 || true
    done
  fi
  cp "$WORK/source-layers" "$layers_file"
  log "build: layer cache: $(B images --all --quiet | wc -l) images in $CACHE (the apt and toolkit layers, and per flavour its tree's source layers: $(wc -l <"$WORK/source-layers") for this one); $(df -h --output=avail "$CACHE" | tail -n 1 | tr -d ' ') free"
fi

# ---- 4. the image config ---------------------------------------------------------------------
B inspect --type image "$IMAGE" >"$WORK/inspect.json"
"$PYTHON" - "$WORK/inspect.json" "$WORK/healthcheck.sh" "$WORK/entrypoint" "$FLAVOUR" "$NAME" <<'EOF'
import json, sys

inspect = json.load(open(sys.argv[1]))
flavour, name = sys.argv[4], sys.argv[5]
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
# The NVIDIA container toolkit reads these from the image: the CUDA image asks for the driver's
# compute libraries and nvidia-smi on every GPU, and for a CUDA 13 driver; the CPU image asks for
# nothing (a GPU node would otherwise mount its GPUs into it, or refuse it on an old driver).
nvidia = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
          "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}
for key, want in nvidia.items():
    got = env.get(key)
    if flavour == "cuda" and got != want:
        errors.append(f"ENV {key} is {got!r}, expected {want!r}")
    if flavour == "cpu" and got:
        errors.append(f"ENV {key}={got!r} in the CPU image")
if errors:
    sys.exit("image config: " + "; ".join(errors))
with open(sys.argv[2], "w") as f:  # the HEALTHCHECK command, as the engine would run it
    f.write(health[1] if health[0] == "CMD-SHELL" else " ".join(json.dumps(a) for a in health[1:]))
with open(sys.argv[3], "w") as f:
    f.write("\n".join(entrypoint + (config.get("Cmd") or [])))
print(f"{name}: config: USER {user}, ENTRYPOINT {entrypoint}, EXPOSE {sorted(ports)}, "
      f"VOLUME /models, HEALTHCHECK {health[0]} {' '.join(health[1:])}")
if flavour == "cuda":
    print(f"{name}: config: " + ", ".join(f"{k}={env[k]}" for k in nvidia))
EOF

B from --pull=never --name "$CTR" "$IMAGE" >/dev/null
# buildah run mounts an anonymous volume over each VOLUME of the container's config, after
# (so hiding) the -v bind mounts: drop /models from this working container's config only.
# The image keeps its VOLUME (checked above).
B config --volume /models- "$CTR"
# R: run a command in the image's container as the image's user, on the host network.
R() { B run --isolation chroot --network host "$@"; }

PLUGIN=/usr/local/lib/libfastformer_cuda_engine.so
uid=$(R "$CTR" -- id -u)
[ "$uid" != 0 ] || fail "commands in the image run as root"
plugin_state=$(R "$CTR" -- sh -c "test -f $PLUGIN && echo present || echo absent")
if [ "$FLAVOUR" = cuda ]; then
  [ "$plugin_state" = present ] || fail "the CUDA image has no $PLUGIN"
  libs_of="/usr/local/bin/fastformer-* $PLUGIN"
else
  [ "$plugin_state" = absent ] || fail "the CPU image holds the CUDA plugin $PLUGIN"
  libs_of="/usr/local/bin/fastformer-*"
fi
R "$CTR" -- sh -c "ldd $libs_of" >"$WORK/ldd.txt" 2>&1 || fail "ldd in the image failed: $(cat "$WORK/ldd.txt")"
missing_libs=$(grep "not found" "$WORK/ldd.txt" || true)
[ -z "$missing_libs" ] || fail "runtime libraries missing in the image (deploy/install-deps.sh --runtime, the Dockerfile's CUDA libraries): $missing_libs"
toolchain=$(R "$CTR" -- sh -c 'command -v cc c++ gcc cmake nvcc || true')
[ -z "$toolchain" ] || fail "the runtime image holds build tools: $toolchain"
checked="every binary's shared libraries resolve"
if [ "$FLAVOUR" = cuda ]; then
  cudart_at=$(awk '$1 == "libcudart.so.13" {print $3; exit}' "$WORK/ldd.txt")
  [ -n "$cudart_at" ] || fail "the plugin does not link libcudart.so.13: $(cat "$WORK/ldd.txt")"
  checked="every binary's and the plugin's shared libraries resolve ($(grep -c '=>' "$WORK/ldd.txt") entries; libcudart.so.13 => $cudart_at)"
fi
log "run: commands run as uid $uid; $checked; no compiler in the image"

# ---- 5. cuBLASLt in the image, with no GPU (--cuda) --------------------------------------------
if [ "$FLAVOUR" = cuda ]; then
  # The engine opens libcublasLt.so.13 with dlopen (server/engine/cuda/gemm_cublaslt.cc): a probe
  # built here (glibc only; the image is the same Debian) opens it the same way inside the image,
  # as the image's user, and asks its version and libcudart's (which needs no GPU either).
  mkdir -p "$WORK/probe"
  cat >"$WORK/cuda-probe.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

static void* open_library(const char* name) {
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) printf("error: dlopen(%s): %s\n", name, dlerror());
  return lib;
}
static const char* path_of(void* symbol) {
  Dl_info info;
  return dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "?";
}
int main(int argc, char** argv) {
  const char* lt_name = argc > 1 ? argv[1] : "libcublasLt.so.13";
  const char* rt_name = argc > 2 ? argv[2] : "libcudart.so.13";
  int rc = 0;
  void* lt = open_library(lt_name);
  void* rt = open_library(rt_name);
  if (lt != NULL) {
    size_t (*version)(void) = (size_t (*)(void))dlsym(lt, "cublasLtGetVersion");
    size_t (*cudart)(void) = (size_t (*)(void))dlsym(lt, "cublasLtGetCudartVersion");
    if (version == NULL || cudart == NULL) {
      printf("error: %s has no cublasLtGetVersion or cublasLtGetCudartVersion\n", lt_name);
      rc = 1;
    } else {
      size_t v = version();
      printf("cublasLt version=%zu.%zu.%zu (%zu) cudart_of_build=%zu path=%s\n", v / 10000,
             v / 100 % 100, v % 100, v, cudart(), path_of((void*)version));
    }
  } else {
    rc = 1;
  }
  if (rt != NULL) {
    int (*runtime)(int*) = (int (*)(int*))dlsym(rt, "cudaRuntimeGetVersion");
    int (*driver)(int*) = (int (*)(int*))dlsym(rt, "cudaDriverGetVersion");
    int (*count)(int*) = (int (*)(int*))dlsym(rt, "cudaGetDeviceCount");
    const char* (*text)(int) = (const char* (*)(int))dlsym(rt, "cudaGetErrorString");
    if (runtime == NULL || driver == NULL || count == NULL || text == NULL) {
      printf("error: %s lacks the runtime's version or device calls\n", rt_name);
      rc = 1;
    } else {
      int r = 0, d = 0, n = 0;
      runtime(&r);
      driver(&d);
      int err = count(&n);
      printf("cudart runtime=%d driver=%d devices=%d device_query=%d (%s) path=%s\n", r, d, n, err,
             text(err), path_of((void*)runtime));
    }
  } else {
    rc = 1;
  }
  return rc;
}
EOF
  cc -O2 -Wall -o "$WORK/probe/cuda-probe" "$WORK/cuda-probe.c" 2>"$WORK/probe-cc.log" ||
    fail "cannot build the cuBLASLt probe: $(cat "$WORK/probe-cc.log")"
  chmod -R a+rX "$WORK/probe"
  R -v "$WORK/probe:/probe:ro" "$CTR" -- /probe/cuda-probe >"$WORK/probe.out" 2>&1 ||
    fail "the image's cuBLASLt or cudart did not load: $(cat "$WORK/probe.out")"
  pinned=$(sed -n 's/^nvidia-cublas==\([0-9]*\.[0-9]*\.[0-9]*\).*/\1/p' deploy/cuda-wheels.txt)
  got=$(sed -n 's/^cublasLt version=\([0-9.]*\) .*/\1/p' "$WORK/probe.out")
  if [ -z "$pinned" ] || [ "$got" != "$pinned" ]; then
    fail "the image's cuBLASLt is '${got:-unknown}', deploy/cuda-wheels.txt pins nvidia-cublas $pinned: $(cat "$WORK/probe.out")"
  fi
  while IFS= read -r line; do log "cuBLASLt: $line"; done <"$WORK/probe.out"
  log "cuBLASLt: the image's libcublasLt.so.13 loads as the engine opens it and is $got, deploy/cuda-wheels.txt's (no GPU needed)"
fi

# ---- 6. the server inside the image ----------------------------------------------------------
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
# The CUDA image on no GPU: --backend auto (the default, named) must serve on the CPU.
ENCODE_BACKEND=cpu
if [ "$FLAVOUR" = cuda ]; then
  ENV_ARGS+=(-e FASTFORMER_BACKEND=auto)
  ENCODE_BACKEND=auto
fi
mapfile -t entrypoint <"$WORK/entrypoint"
log "run: ${entrypoint[*]} (image entry point) with /models = demo model (tiny), gRPC 127.0.0.1:$GRPC_PORT, metrics 127.0.0.1:$METRICS_PORT$([ "$FLAVOUR" = cuda ] && echo ", FASTFORMER_BACKEND=auto")"
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
if [ "$FLAVOUR" = cuda ]; then
  # engine.cc: "auto: <why the CUDA engine is not usable>; using the CPU engine".
  why=$(grep -m1 -o 'auto: no usable CUDA driver or device[^;]*; using the CPU engine' "$WORK/server.log" || true)
  [ -n "$why" ] || fail "the server's log does not say why --backend auto serves on the CPU (expected 'auto: no usable CUDA driver or device (...); using the CPU engine'); its log:
$(cat "$WORK/server.log")"
  log "run: --backend auto with no GPU serves on the CPU; the log says: $why"
fi

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
R -v "$MODEL:/models:ro" -v "$IO:/io:ro" "$CTR" -- fastformer-encode --backend "$ENCODE_BACKEND" --dtype float32 \
  --input /io/input.jsonl --return-token-embeddings >"$WORK/offline.jsonl" 2>"$WORK/encode.log" ||
  fail "fastformer-encode in the image failed: $(cat "$WORK/encode.log")"
if [ "$FLAVOUR" = cuda ]; then
  grep -q 'using the CPU engine' "$WORK/encode.log" ||
    fail "the image's fastformer-encode --backend auto does not say it fell back to the CPU: $(cat "$WORK/encode.log")"
fi
compare() {
  "$PYTHON" - "$NAME" "$@" <<'EOF'
import json, sys

name, served_path, offline_path, what = sys.argv[1:5]
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
print(f"{name}: encode: {len(served)} sequences, {count} numbers equal to {what} (max |diff| {worst:.3g})")
EOF
}
compare "$WORK/served.jsonl" "$WORK/offline.jsonl" "the image's fastformer-encode --backend $ENCODE_BACKEND" ||
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

# ---- 7. --backend cuda with no GPU, and the image's size (--cuda) ------------------------------
if [ "$FLAVOUR" = cuda ]; then
  cuda_rc=0
  R "${ENV_ARGS[@]}" -v "$MODEL:/models:ro" "$CTR" -- timeout 120 "${entrypoint[@]}" --backend cuda \
    >"$WORK/server-cuda.log" 2>&1 || cuda_rc=$?
  [ "$cuda_rc" -ne 0 ] || fail "fastformer-server --backend cuda exited 0 with no GPU; its log:
$(tail -n 20 "$WORK/server-cuda.log")"
  [ "$cuda_rc" -ne 124 ] || fail "fastformer-server --backend cuda with no GPU was still running after 120 s; its log:
$(tail -n 20 "$WORK/server-cuda.log")"
  said=$(grep -m1 -o 'backend cuda: .*\(driver\|device\).*' "$WORK/server-cuda.log" || true)
  [ -n "$said" ] || fail "fastformer-server --backend cuda failed (exit $cuda_rc) without naming the missing driver or device; its log:
$(tail -n 20 "$WORK/server-cuda.log")"
  log "run: --backend cuda with no GPU exits $cuda_rc: $said"

  # Sizes, from the image's root filesystem (and the base's, for what Debian itself costs).
  mnt=$(B mount "$CTR")
  base_ctr=$(B from --pull=never "$BASE")
  base_mnt=$(B mount "$base_ctr")
  bytes() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
  total=$(bytes "$mnt")
  base_bytes=$(bytes "$base_mnt")
  B rm "$base_ctr" >/dev/null
  cuda_lib=$(readlink -f "$mnt/usr/local/cuda")
  cublaslt=$(bytes "$cuda_lib/lib/libcublasLt.so.13")
  cudart=$(bytes "$cuda_lib/lib/libcudart.so.13")
  licences=$(bytes "$cuda_lib/dist-info")
  plugin=$(bytes "$mnt$PLUGIN")
  programs=$(bytes "$mnt"/usr/local/bin/fastformer-*)
  B umount "$CTR" >/dev/null
  debian_libs=$((total - base_bytes - cublaslt - cudart - licences - plugin - programs))
  mb() { awk -v b="$1" 'BEGIN {printf "%.1f MB", b / 1e6}'; }
  log "size: $(mb "$total") in all (buildah: $image_size), budget $CUDA_BUDGET_MB MB:"
  log "size:   libcublasLt.so.13 $(mb "$cublaslt"); libcudart.so.13 $(mb "$cudart"); NVIDIA's licences and dist-info $(mb "$licences")"
  log "size:   the plugin (kernels for CUDA_ARCHS=$CUDA_ARCHS) $(mb "$plugin"); the five programs $(mb "$programs")"
  log "size:   Debian: the minbase standing in for bookworm-slim $(mb "$base_bytes"), install-deps.sh --runtime's libraries $(mb "$debian_libs")"
  log "size:   all but cuBLASLt: $(mb $((total - cublaslt)))"
  [ "$total" -le $((CUDA_BUDGET_MB * 1000000)) ] ||
    fail "the CUDA image is $(mb "$total"), over its budget of $CUDA_BUDGET_MB MB (FASTFORMER_IMAGE_TEST_CUDA_BUDGET_MB)"
fi

# ---- what this test cannot cover ---------------------------------------------------------------
echo "$NOT_COVERED"
if [ -n "${FASTFORMER_IMAGE_TEST_IMAGE:-}" ]; then
  log "PASSED for the existing image $IMAGE (not rebuilt: FASTFORMER_IMAGE_TEST_IMAGE); total $SECONDS s"
elif [ "$FLAVOUR" = cpu ]; then
  log "PASSED: the CPU image (Dockerfile with FASTFORMER_CUDA=OFF on a debootstrapped debian:$SUITE) builds, runs as uid $uid and serves the same embeddings as the offline encoder; build $build_s s, total $SECONDS s"
else
  log "PASSED: the CUDA image (the Dockerfile's default: debootstrapped debian:$SUITE, NVIDIA's wheels of deploy/cuda-wheels.txt, CUDA_ARCHS=$CUDA_ARCHS) builds, its libraries resolve, its cuBLASLt $got loads, with no GPU it serves on the CPU (same embeddings as the offline encoder) and refuses --backend cuda, runs as uid $uid, $(mb "$total"); build $build_s s, total $SECONDS s"
fi
