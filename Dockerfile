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

# ---- build stage: a venv with the dependencies, then fiberlite ---------------
FROM ${BASE_IMAGE} AS build
ARG PIP_OPTIONS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# 1. Dependencies, read from pyproject.toml: this layer stays cached while only
#    the package sources change. (A wildcard directory copies its contents, so
#    the wheels land next to pyproject.toml in /wheels.)
COPY pyproject.toml .docker-wheel[s] /wheels/
RUN python3 -c "import tomllib; p = tomllib.load(open('/wheels/pyproject.toml', 'rb'))['project']; \
x = p.get('optional-dependencies', {}); \
print(*p.get('dependencies', []), *x.get('docker', []), *x.get('kubernetes', []), 'numpy', sep='\n')" \
        > /tmp/requirements.txt \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install ${PIP_OPTIONS} --find-links /wheels -r /tmp/requirements.txt
# 2. fiberlite itself (.dockerignore limits the context to the package,
#    pyproject.toml, README/LICENSE and the wheelhouses). It has a C extension: a
#    wheel built on the host for this image's Python (.docker-fiberlite/, made by
#    .ci/docker_setup.sh) is installed as it is; without one it is compiled here,
#    with a C compiler the build stage installs if the base image has none.
COPY . /src
RUN set -e; wheel="$(ls /src/.docker-fiberlite/fiberlite-*.whl 2>/dev/null | head -n 1)"; \
    if [ -n "$wheel" ]; then \
        /opt/venv/bin/pip install ${PIP_OPTIONS} --find-links /wheels "${wheel}[docker,kubernetes]"; \
    else \
        command -v cc >/dev/null 2>&1 || { apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev; }; \
        /opt/venv/bin/pip install ${PIP_OPTIONS} --find-links /wheels "/src[docker,kubernetes]"; \
    fi
# Lets tools find (and prune) stale build-stage images of the classic builder.
LABEL org.fiberlite.stage=build

# ---- final stage: same base, only the venv (no wheels, no sources). ----------
# The venv keeps pip's precompiled bytecode so that job start-up stays fast.
FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
CMD ["fiberlite", "--help"]
