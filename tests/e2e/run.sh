#!/bin/sh
# `make e2e`: the cluster end to end in real containers (tests/e2e/cluster_e2e.py;
# its swarm case: tests/e2e/swarm_e2e.py; its remote worker host: tests/e2e/remote_e2e.py).
#
# Installs docker.io, docker-compose and debootstrap from Debian packages when
# missing, starts a Docker engine when none is reachable (and stops it at the
# end: only that one), then runs the test. Without a container registry the
# images are built from Debian packages (scripts/build-images.sh).
set -eu
cd "$(dirname "$0")/../.."
scripts/ensure-system-packages.sh dockerd=docker.io docker-compose=docker-compose \
    debootstrap=debootstrap

started_engine=0
# the swarm and remote cases run engines of their own (scripts/swarm-hosts.sh), not this one
cases=${E2E_CASES:-single,cluster,swarm,remote}
case ",$cases," in
*,single,* | *,cluster,*) need_engine=1 ;;
*) need_engine=0 ;;
esac
if [ "$need_engine" = 1 ] && ! docker info >/dev/null 2>&1; then
    scripts/docker-engine.sh start
    started_engine=1
fi

status=0
.venv/bin/python tests/e2e/cluster_e2e.py || status=$?

if [ "$started_engine" = 1 ]; then
    # quietly: the test's "N passed, M failed" line stays the last one
    scripts/docker-engine.sh stop >/dev/null || echo "could not stop dockerd" >&2
fi
exit "$status"
