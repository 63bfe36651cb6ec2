#!/bin/sh
# Install the Debian packages that provide the given commands, when missing.
# usage: ensure-system-packages.sh command=package [command=package ...]
set -eu
missing=""
for pair in "$@"; do
    cmd=${pair%%=*}
    pkg=${pair#*=}
    if ! command -v "$cmd" >/dev/null 2>&1; then
        missing="$missing $pkg"
    fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "missing system packages:$missing; install them (apt-get install$missing) or run as root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing system packages:$missing and no apt-get to install them" >&2
    exit 1
fi
echo "installing system packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
