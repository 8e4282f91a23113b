#!/usr/bin/env bash
# Make a Docker engine and the fiberlite test image available on this machine.
#
#   .ci/docker_setup.sh          # idempotent; seconds when everything is in place
#
# Steps (each skipped when already done):
#   a. no answering daemon: as root with apt, install docker.io (+ debootstrap)
#      and start dockerd in the background (log: $DOCKERD_LOG).
#   b. no base image $BASE_IMAGE: debootstrap a minimal Debian bookworm with
#      Python 3.11 and `docker import` it (no registry needed).
#   c. build the host wheelhouse .docker-wheels/ (containers cannot reach the
#      package index) when the dependencies in pyproject.toml changed, and
#   d. docker build $IMAGE on $BASE_IMAGE with --no-index, unless the image
#      already carries a label equal to the hash of its inputs.
#
# Environment overrides: FIBERLITE_IMAGE (fiberlite:test),
# FIBERLITE_BASE_IMAGE (fiberlite-base:bookworm), FIBERLITE_DEBIAN_MIRROR
# (default: taken from apt's sources), DOCKERD_LOG (/tmp/fiberlite-dockerd.log),
# FIBERLITE_FORCE_REBUILD=1 (ignore the hash label).
# Progress goes to stderr; on failure, exits non-zero with the reason and the
# tail of the failing step's log.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${FIBERLITE_IMAGE:-fiberlite:test}"
BASE_IMAGE="${FIBERLITE_BASE_IMAGE:-fiberlite-base:bookworm}"
DOCKERD_LOG="${DOCKERD_LOG:-/tmp/fiberlite-dockerd.log}"
WHEELS="$ROOT/.docker-wheels"
LABEL="org.fiberlite.inputs-hash"
LOGDIR="$(mktemp -d /tmp/fiberlite-docker-setup.XXXXXX)"
SETUP=docker_setup
STEP_LOGS="$LOGDIR"
# shellcheck source=steps.sh
source "$ROOT/.ci/steps.sh"
# Keep step logs only when something failed.
cleanup() {
    local rc=$?
    [[ -n "${ROOTFS:-}" && -d "$ROOTFS" ]] && rm -rf "$ROOTFS"
    [[ $rc -eq 0 ]] && rm -rf "$LOGDIR"
    return $rc
}
trap cleanup EXIT

# Serialize concurrent runs (e.g. several pytest workers).
LOCK=/tmp/fiberlite-docker-setup.lock
exec 9>"$LOCK"
if ! flock -n 9; then
    log "waiting for another docker_setup.sh run to finish (lock $LOCK)"
    flock -w 1200 9 || die "timed out waiting for the lock $LOCK"
fi

docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

# ---- a. Docker engine --------------------------------------------------------
if ! docker_ok; then
    [[ $EUID -eq 0 ]] || die "no Docker daemon answers and not root: start Docker (or run as root) and retry"
    command -v apt-get >/dev/null 2>&1 || die "no Docker daemon answers and apt-get is unavailable: install and start Docker"
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1 \
            || ! command -v debootstrap >/dev/null 2>&1; then
        log "installing docker.io and debootstrap with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        run apt-update apt-get update
        run apt-install apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends docker.io debootstrap
    fi
    if ! docker_ok; then
        log "starting dockerd (log: $DOCKERD_LOG)"
        # Own session and no inherited fds (not the caller's pipes, not our lock fd 9):
        # survives this script and its caller's timeouts without holding them open.
        setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null 9>&- &
        for _ in $(seq 60); do docker_ok && break; sleep 1; done
        docker_ok || { tail -n 20 "$DOCKERD_LOG" | sed 's/^/    | /' >&2; die "dockerd did not answer within 60 s (log: $DOCKERD_LOG)"; }
    fi
    log "Docker engine ready"
fi

# ---- b. base image -----------------------------------------------------------
debian_mirror() {
    # First URI of an apt source that serves plain Debian suites (not security/updates).
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk 'BEGIN{RS=""; FS="\n"}
             { uri=""; suites=""; types="";
               for (i=1;i<=NF;i++) {
                 if ($i ~ /^URIs:/)   { sub(/^URIs:[ \t]*/,"",$i);   split($i,u,/[ \t]+/); uri=u[1] }
                 if ($i ~ /^Suites:/) { sub(/^Suites:[ \t]*/,"",$i); suites=$i }
                 if ($i ~ /^Types:/)  { types=$i } }
               if (types ~ /(^|[ \t])deb([ \t]|$)/ && uri !~ /security/ && suites ~ /(^|[ \t])[a-z]+([ \t]|$)/) { print uri; exit } }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk '$1=="deb" { i=2; if ($2 ~ /^\[/) { while (i<=NF && $i !~ /\]$/) i++; i++ }
                         if ($(i) !~ /security/ && $(i+1) ~ /^[a-z]+$/) { print $(i); exit } }' "$f"
    done
}

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null 2>&1 || {
        [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing (needed to make $BASE_IMAGE)"
        log "installing debootstrap with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        run apt-update apt-get update
        run apt-install apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends debootstrap
    }
    MIRROR="${FIBERLITE_DEBIAN_MIRROR:-$(debian_mirror | head -n 1)}"
    [[ -n "$MIRROR" ]] || die "no Debian mirror found in apt sources; set FIBERLITE_DEBIAN_MIRROR"
    log "debootstrapping $BASE_IMAGE from $MIRROR (about 25 s)"
    ROOTFS="$(mktemp -d /tmp/fiberlite-rootfs.XXXXXX)"
    run debootstrap debootstrap --variant=minbase \
        --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
        bookworm "$ROOTFS" "$MIRROR"
    # Debian's Python refuses `pip install` outside a venv otherwise (PEP 668).
    rm -f "$ROOTFS"/usr/lib/python3.*/EXTERNALLY-MANAGED
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/log/*
    log "importing $BASE_IMAGE"
    run import bash -c 'tar -C "$1" -c . | docker import \
        -c "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        -c "ENV LANG=C.UTF-8" -c "CMD [\"python3\"]" - "$2"' _ "$ROOTFS" "$BASE_IMAGE"
    rm -rf "$ROOTFS"; ROOTFS=""
fi

# ---- c/d. wheelhouse and project image -----------------------------------------
cd "$ROOT"
[[ -f pyproject.toml && -f Dockerfile ]] || die "pyproject.toml or Dockerfile missing in $ROOT"
# Inputs of the image: build files, package sources, this script, the base image.
inputs_hash() {
    {
        local f
        for f in Dockerfile .dockerignore pyproject.toml README.md .ci/docker_setup.sh; do
            [[ -f "$f" ]] && sha256sum "$f"
        done
        find fiberlite -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' -print0 \
            | LC_ALL=C sort -z | xargs -0 -r sha256sum
        docker image inspect -f '{{.Id}}' "$BASE_IMAGE"
    } | sha256sum | cut -c1-32
}
HASH="$(inputs_hash)"
CURRENT="$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" 2>/dev/null || true)"
if [[ "$CURRENT" == "$HASH" && "${FIBERLITE_FORCE_REBUILD:-0}" != 1 ]]; then
    log "$IMAGE is up to date (inputs $HASH)"
    exit 0
fi

[[ -f fiberlite/__init__.py ]] || die "fiberlite/__init__.py missing in $ROOT: the package cannot be built yet"

# Wheelhouse: wheels of the dependencies of fiberlite[docker,kubernetes], numpy,
# and the build backend (the image builds fiberlite from source, with build
# isolation). It depends on pyproject.toml only, so it is rebuilt only when that
# changes. Wheels must suit the image's Python (bookworm: CPython 3.11,
# glibc 2.36): the host Python must be 3.11 too.
PYTHON="${PYTHON:-python3}"
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    || die "cannot run host Python '$PYTHON' (set PYTHON=...)"
[[ "$PYVER" == 3.11 ]] || die "host $PYTHON is $PYVER; wheels for the image need Python 3.11 (set PYTHON=...)"
REQS="$LOGDIR/requirements.txt"
"$PYTHON" - pyproject.toml >"$REQS" <<'PY' || die "cannot read the dependencies from pyproject.toml"
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
x = p.get("optional-dependencies", {})
print(*p.get("dependencies", []), *x.get("docker", []), *x.get("kubernetes", []),
      "numpy", "setuptools>=74.1", "wheel", sep="\n")
PY
WHEELS_HASH="$(sha256sum <"$REQS" | cut -c1-32)"
if [[ "$(cat "$WHEELS/.inputs-hash" 2>/dev/null)" != "$WHEELS_HASH" ]]; then
    log "building wheelhouse .docker-wheels/ with pip wheel"
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    run pip-wheel "$PYTHON" -m pip wheel --wheel-dir "$WHEELS" -r "$REQS"
    echo "$WHEELS_HASH" >"$WHEELS/.inputs-hash"
fi
# fiberlite's own wheel (it has a C extension; the image has no compiler): built here,
# for the image's Python (the same 3.11 as the host's) and glibc (Debian bookworm's).
# The host's setuptools builds it when it is recent enough (pyproject.toml's
# build requirement): an isolated build environment costs ten seconds more.
log "building the fiberlite wheel"
rm -rf "$ROOT/.docker-fiberlite"
ISOLATION=()
"$PYTHON" -c 'import sys, setuptools, wheel
sys.exit(tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (74, 1))' 2>/dev/null \
    && ISOLATION=(--no-build-isolation)
run fiberlite-wheel "$PYTHON" -m pip wheel --no-deps "${ISOLATION[@]}" --wheel-dir "$ROOT/.docker-fiberlite" "$ROOT"
log "building $IMAGE on $BASE_IMAGE"
BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PIP_OPTIONS=--no-index")
# Classic builder (no buildx plugin): also remove the containers of failed steps.
docker buildx version >/dev/null 2>&1 || BUILD_ARGS+=(--force-rm)
# The build stage gets a tag of its own: it stays as the layer cache (the
# dependencies) of the next build, while older build stages can be pruned.
run docker-build-stage docker build "${BUILD_ARGS[@]}" --target deps -t "$IMAGE-build" .
run docker-build docker build "${BUILD_ARGS[@]}" --label "$LABEL=$HASH" -t "$IMAGE" .
run smoke docker run --rm --network host "$IMAGE" python -c "import fiberlite, pynng, cloudpickle"
# Drop previous builds (now untagged) of the image and of its build stage.
docker image prune -f --filter "label=$LABEL" >/dev/null 2>&1 || true
docker image prune -f --filter "label=org.fiberlite.stage=build" >/dev/null 2>&1 || true
log "$IMAGE built (inputs $HASH)"
