#!/bin/sh
# Worker entrypoint: checks the environment, applies SCRAPYD_MAX_PROC, then
# execs the command (scrapyd by default) so it gets the signals.
set -eu
if [ "${1:-}" = scrapyd ]; then
    if [ -z "${SCRAPYD_USERNAME:-}" ] || [ -z "${SCRAPYD_PASSWORD:-}" ]; then
        echo "SCRAPYD_USERNAME and SCRAPYD_PASSWORD must be set: an egg upload runs code on this node" >&2
        exit 64
    fi
    case "${SCRAPYD_MAX_PROC:-}" in
        ''|*[!0-9]*|0) echo "SCRAPYD_MAX_PROC must be a positive integer, got '${SCRAPYD_MAX_PROC:-}'" >&2; exit 64 ;;
    esac
    # scrapyd reads ./scrapyd.conf after /etc/scrapyd/scrapyd.conf
    printf '[scrapyd]\nmax_proc = %s\n' "$SCRAPYD_MAX_PROC" >"$HOME/scrapyd.conf"
    cd "$HOME"
fi
exec "$@"
