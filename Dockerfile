# Image for fiberlite jobs (docker / kubernetes backends).
#
# Normal use, with a registry and internet access:
#     docker build -t fiberlite .
#
# Offline / CI use (what .ci/docker_setup.sh does on machines without a
# registry, or whose containers cannot reach the package index): put wheels for
# all dependencies in .docker-wheels/ (git-ignored), then
#     docker build --build-arg BASE_IMAGE=fiberlite-base:bookworm \
#                  --build-arg PIP_OPTIONS=--no-index -t fiberlite:test .
#
# Build arguments:
#   BASE_IMAGE   any image with Python 3.11+ (tomllib), its headers (python:*-slim has
#                them) and the venv module; default python:3.11-slim.
#   PIP_OPTIONS  extra pip options, default none; "--no-index" makes pip use
#                the wheelhouse only.
# Wheelhouse: wheels in .docker-wheels/ are always offered to pip through
# --find-links; the directory may be missing or empty (`.docker-wheel[s]` is a
# wildcard, so COPY does not fail without it).
#
# Works with the classic builder and with BuildKit (no BuildKit-only syntax).

ARG BASE_IMAGE=python:3.11-slim

# ---- dependencies stage: a venv with fiberlite's dependencies --------------
# Read from pyproject.toml: this stage, and the layer of the final image that
# copies it, stay cached while only the package sources change. (A wildcard
# directory copies its contents, so the wheels land next to pyproject.toml.)
FROM ${BASE_IMAGE} AS deps
ARG PIP_OPTIONS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml .docker-wheel[s] /wheels/
RUN python3 -c "import tomllib; p = tomllib.load(open('/wheels/pyproject.toml', 'rb'))['project']; \
x = p.get('optional-dependencies', {}); \
print(*p.get('dependencies', []), *x.get('docker', []), *x.get('kubernetes', []), 'numpy', sep='\n')" \
        > /tmp/requirements.txt \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install ${PIP_OPTIONS} --find-links /wheels -r /tmp/requirements.txt
# Lets tools find (and prune) stale stages of the classic builder.
LABEL org.fiberlite.stage=build

# ---- wheel stage: fiberlite's own wheel --------------------------------------
# .dockerignore limits the context to the package, pyproject.toml, README/LICENSE
# and the wheelhouses. fiberlite has an optional C extension: a wheel built on the
# host for this image's Python (.docker-fiberlite/, made by .ci/docker_setup.sh) is
# taken as it is; without one, the wheel is built here, with a C compiler if the
# stage can install one (without, the package falls back to its portable path).
FROM deps AS wheel
ARG PIP_OPTIONS=""
COPY . /src
RUN set -e; mkdir -p /out; \
    if ls /src/.docker-fiberlite/fiberlite-*.whl >/dev/null 2>&1; then \
        cp /src/.docker-fiberlite/fiberlite-*.whl /out/; \
    else \
        command -v cc >/dev/null 2>&1 \
            || { apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev; } || true; \
        /opt/venv/bin/pip wheel ${PIP_OPTIONS} --find-links /wheels --no-deps -w /out /src; \
    fi
LABEL org.fiberlite.stage=build

# ---- final stage: same base, the dependencies' venv, then fiberlite ----------
# The venv keeps pip's precompiled bytecode so that job start-up stays fast.
FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=deps /opt/venv /opt/venv
COPY --from=wheel /out /tmp/fiberlite-wheel
RUN /opt/venv/bin/pip install --no-deps --no-index /tmp/fiberlite-wheel/fiberlite-*.whl \
 && rm -rf /tmp/fiberlite-wheel
WORKDIR /app
CMD ["fiberlite", "--help"]
