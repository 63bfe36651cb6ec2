#!/bin/sh
# Make the cluster's images available, with or without a container registry.
#
# usage: build-images.sh ENV_FILE
#
# With a registry: pulls the base images named in docker-compose.yml.
# Without one (no pull succeeds): builds a Debian bookworm root filesystem with
# debootstrap from the Debian mirror apt uses, imports it as a base image,
# builds the redis and prometheus images on it (Debian's packages), builds a
# wheelhouse on the host with an interpreter matching the image's Python, and
# records the image names and pip's offline options (WORKER_BASE_IMAGE,
# REDIS_IMAGE, PROMETHEUS_IMAGE, WORKER_PIP_*) in ENV_FILE so that
# docker-compose builds and runs the offline images.
# Either way it then builds the worker image (`docker-compose build worker`).
set -eu
cd "$(dirname "$0")/.."
ENV_FILE=${1:?usage: build-images.sh ENV_FILE}
OFFLINE_TAG=${OFFLINE_TAG:-bookworm}
OFFLINE_BASE=bloomcrawl-offline/debian:$OFFLINE_TAG
OFFLINE_REDIS=bloomcrawl-offline/redis:$OFFLINE_TAG
OFFLINE_PROMETHEUS=bloomcrawl-offline/prometheus:$OFFLINE_TAG
WHEELS=deploy/wheels
CACHE=.cache
PULL_TIMEOUT=${PULL_TIMEOUT:-60}

env_value() {  # the value of $1 in ENV_FILE, empty when unset
    sed -n "s/^$1=//p" "$ENV_FILE" | tail -n 1
}

set_env_value() {  # set $1=$2 in ENV_FILE, replacing any earlier line
    tmp="$ENV_FILE.tmp"
    grep -v "^$1=" "$ENV_FILE" >"$tmp" || true
    echo "$1=$2" >>"$tmp"
    mv "$tmp" "$ENV_FILE"
}

have_image() {
    docker image inspect "$1" >/dev/null 2>&1
}

pull() {
    have_image "$1" && return 0
    echo "pulling $1"
    timeout "$PULL_TIMEOUT" docker pull -q "$1" >/dev/null 2>&1
}

debian_mirror() {
    # the first Debian archive URL among apt's sources (deb822 or one-line format)
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -v '^#' | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ')
    echo "${mirror:-http://deb.debian.org/debian}"
}

build_offline_base() {
    have_image "$OFFLINE_BASE" && return 0
    scripts/ensure-system-packages.sh debootstrap=debootstrap
    rootfs=$(mktemp -d "${TMPDIR:-/tmp}/bloomcrawl-rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    mirror=$(debian_mirror)
    echo "debootstrap bookworm from $mirror (about a minute)"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,redis-server,prometheus,tini \
        bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 || {
        tail -n 30 "$CACHE/debootstrap.log" >&2
        exit 1
    }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$OFFLINE_BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
}

python_version_of_image() {
    docker run --rm --entrypoint python3 "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])'
}

matching_interpreter() {  # a host interpreter of exactly version $1
    for candidate in /usr/bin/python3 "python$(echo "$1" | cut -d. -f1,2)" python3; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        v=$("$candidate" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
        if [ "$v" = "$1" ]; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

build_wheelhouse() {
    version=$(python_version_of_image "$OFFLINE_BASE")
    if ! python=$(matching_interpreter "$version"); then
        echo "no host interpreter of Python $version (the image's) to build the wheelhouse with;" \
            "install one (on Debian bookworm: apt-get install python3 python3-venv)" >&2
        exit 1
    fi
    stamp="$WHEELS/.built-for"
    want="$version $(cat pyproject.toml | cksum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    echo "building the wheelhouse with $python (Python $version)"
    venv="$CACHE/wheelhouse-venv-$version"
    [ -x "$venv/bin/pip" ] || "$python" -m venv "$venv"
    # what the worker image installs (the project's dependencies and the demo extra's:
    # deploy/Dockerfile) plus what pip needs to build the project offline
    "$venv/bin/python" - >"$CACHE/requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
for requirement in (project["project"]["dependencies"]
                    + project["project"]["optional-dependencies"]["demo"]
                    + project["build-system"]["requires"]):
    print(requirement)
print("wheel")
PY
    "$venv/bin/pip" wheel -q --disable-pip-version-check --find-links "$WHEELS" \
        --wheel-dir "$WHEELS" -r "$CACHE/requirements.txt"
    echo "$want" >"$stamp"
}

mkdir -p "$CACHE" "$WHEELS"
default_base=$(sed -n 's/^ *BASE_IMAGE: *"\${WORKER_BASE_IMAGE:-\(.*\)}"$/\1/p' docker-compose.yml | head -n 1)
default_redis=$(sed -n 's/^ *image: *"\${REDIS_IMAGE:-\(.*\)}"$/\1/p' docker-compose.yml | head -n 1)
default_prometheus=$(sed -n 's/^ *image: *"\${PROMETHEUS_IMAGE:-\(.*\)}"$/\1/p' docker-compose.yml | head -n 1)
default_grafana=$(sed -n 's/^ *image: *"\${GRAFANA_IMAGE:-\(.*\)}"$/\1/p' docker-compose.yml | head -n 1)

if [ "$(env_value WORKER_BASE_IMAGE)" = "$OFFLINE_BASE" ]; then
    offline=1
elif [ -n "$(env_value WORKER_BASE_IMAGE)" ]; then
    offline=0  # the user chose a base image: use it as it is
elif pull "$default_base" && pull "$default_redis" && pull "$default_prometheus"; then
    offline=0
else
    echo "no container registry reachable: building the images from Debian packages"
    offline=1
fi

if [ "$offline" = 1 ]; then
    build_offline_base
    have_image "$OFFLINE_REDIS" || docker build -q --force-rm -t "$OFFLINE_REDIS" \
        --build-arg BASE_IMAGE="$OFFLINE_BASE" -f deploy/redis.Dockerfile deploy >/dev/null
    have_image "$OFFLINE_PROMETHEUS" || docker build -q --force-rm -t "$OFFLINE_PROMETHEUS" \
        --build-arg BASE_IMAGE="$OFFLINE_BASE" -f deploy/prometheus.Dockerfile deploy >/dev/null
    build_wheelhouse
    set_env_value WORKER_BASE_IMAGE "$OFFLINE_BASE"
    set_env_value REDIS_IMAGE "$OFFLINE_REDIS"
    set_env_value PROMETHEUS_IMAGE "$OFFLINE_PROMETHEUS"
    set_env_value WORKER_PIP_NO_INDEX 1
    set_env_value WORKER_PIP_FIND_LINKS /wheels
    echo "Grafana is left out: it has no Debian package to build an image from offline"
elif [ -z "$(env_value GRAFANA_ENABLED)" ]; then
    grafana_image=$(env_value GRAFANA_IMAGE)
    if pull "${grafana_image:-$default_grafana}"; then
        set_env_value GRAFANA_ENABLED 1
    else
        echo "Grafana is left out: its image could not be pulled"
    fi
fi

echo "building the worker image"
compose=${BLOOMCRAWL_COMPOSE:-}
if [ -z "$compose" ]; then
    if command -v docker-compose >/dev/null 2>&1; then compose=docker-compose; else compose="docker compose"; fi
fi
force_rm=""  # v1's classic builder leaves a failed step's container without it
case "$($compose version --short 2>/dev/null)" in 1.*) force_rm=--force-rm ;; esac
# shellcheck disable=SC2086
$compose --env-file "$ENV_FILE" build -q $force_rm worker
