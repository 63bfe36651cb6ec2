#!/bin/sh
# Start or stop a Docker engine for the cluster, only when none is reachable.
#
# usage: docker-engine.sh start|stop|status
#
# start: when `docker info` already answers, does nothing. Otherwise installs
#   docker.io and docker-compose from Debian packages when missing (as root),
#   starts dockerd in the background with address pools outside the private
#   ranges, records its pid in $STATE_DIR/dockerd.pid and waits until it answers.
# stop: stops the dockerd recorded in $STATE_DIR/dockerd.pid, and nothing else.
set -eu
cd "$(dirname "$0")/.."
STATE_DIR=${BLOOMCRAWL_STATE_DIR:-.run}
PIDFILE=$STATE_DIR/dockerd.pid
LOG=$STATE_DIR/dockerd.log
DOCKERD_BIP=${DOCKERD_BIP:-198.18.0.1/24}
DOCKERD_POOL=${DOCKERD_POOL:-base=198.19.0.0/16,size=24}
TIMEOUT=${DOCKERD_TIMEOUT:-60}

engine_up() {
    docker info >/dev/null 2>&1
}

recorded_pid() {
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
    # the pid must still be the dockerd we started, not a recycled number
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^[^ ]*dockerd ' || return 1
    echo "$pid"
}

case "${1:-}" in
start)
    if engine_up; then
        exit 0
    fi
    if recorded_pid >/dev/null; then
        echo "dockerd (pid $(cat "$PIDFILE")) is running but does not answer; see $LOG" >&2
        exit 1
    fi
    scripts/ensure-system-packages.sh dockerd=docker.io docker-compose=docker-compose
    if [ "$(id -u)" != 0 ]; then
        echo "no Docker engine is reachable, and starting one needs root" >&2
        exit 1
    fi
    mkdir -p "$STATE_DIR"
    echo "starting dockerd (log: $LOG)"
    # setsid: the engine outlives this shell; only its recorded pid stops it
    setsid dockerd --bip="$DOCKERD_BIP" --default-address-pool "$DOCKERD_POOL" \
        >"$LOG" 2>&1 </dev/null &
    spawned=$!
    echo "$spawned" >"$PIDFILE"
    waited=0
    until engine_up; do
        # our own child: alive is enough here, since for its first moments its
        # command line is still this shell's or setsid's, not dockerd's. Dead is
        # gone or a zombie (state Z in /proc/<pid>/stat); an empty command line
        # is not proof: it also reads empty for a moment while the child execs
        state=$(sed 's/.*) //' "/proc/$spawned/stat" 2>/dev/null | cut -d' ' -f1)
        if [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ]; then
            echo "dockerd exited; last lines of $LOG:" >&2
            tail -n 20 "$LOG" >&2
            rm -f "$PIDFILE"
            exit 1
        fi
        if [ "$waited" -ge "$TIMEOUT" ]; then
            echo "dockerd did not answer within ${TIMEOUT}s; see $LOG" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    echo "dockerd is up (pid $(cat "$PIDFILE"))"
    ;;
stop)
    if ! pid=$(recorded_pid); then
        rm -f "$PIDFILE"
        exit 0
    fi
    echo "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    waited=0
    while [ -d "/proc/$pid" ]; do
        if [ "$waited" -ge 60 ]; then
            echo "dockerd (pid $pid) still running after 30s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    rm -f "$PIDFILE"
    ;;
status)
    if engine_up; then
        if pid=$(recorded_pid); then echo "started here (pid $pid)"; else echo "external"; fi
    else
        echo "none"
        exit 1
    fi
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
