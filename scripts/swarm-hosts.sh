#!/bin/sh
# Simulated hosts for the Swarm end-to-end test: network namespaces on this
# machine, each with a Docker engine of its own, joined into one swarm.
#
# usage: swarm-hosts.sh start|stop|status|kill HOST|revive HOST
#
# start: a namespace PREFIX-lan holding a bridge (nothing of it is in the root
#   namespace, so no traffic leaves these namespaces), and per host hN a
#   namespace PREFIX-hN whose eth0 (NET.1N/24) is a port of that bridge. In
#   each host namespace a containerd and a dockerd of their own: data, exec
#   root, sockets and pid files under DIR/hN, the engine's socket
#   DIR/hN/docker.sock. Their networks come from 198.19.0.0/16, outside the
#   private ranges and the bridge's subnet: docker0 198.19.N.1/24, local
#   networks 198.19.16N.0/20, the swarm's overlays 198.19.128.0/17; its host
#   name (UTS namespace) is hN. Then h1
#   inits a swarm (the manager) and the others join it as workers.
#   SWARM_HOSTS_ENGINES=h1,...: only those hosts run an engine;
#   SWARM_HOSTS_SWARM=0: no swarm; SWARM_HOSTS_BIP_BASE / _POOL_BASE shift the
#   engines' networks (host N: docker0 198.19.(B+N).1/24, pools 198.19.(P+16N).0/20)
#   so that another set of hosts can run beside (tests/e2e/remote_e2e.py).
# kill HOST: the host dies: its link goes down and its dockerd, containerd and
#   every process they started (container shims, so the containers) get
#   SIGKILL. revive HOST: its link up, its engine started again (it cleans up
#   what the dead one left and rejoins the swarm).
# stop: every engine this script started (by pid, SIGTERM then SIGKILL after
#   60 s), the mounts they left, the namespaces and DIR.
#
# Nothing is stopped by name: pids come from DIR/hN/*.pid, and a pid is only
#   signalled while its command line is still the recorded program's.
set -eu
cd "$(dirname "$0")/.."
DIR=${SWARM_HOSTS_DIR:-$(pwd)/.run/hosts}
COUNT=${SWARM_HOSTS:-3}
PREFIX=${SWARM_HOSTS_PREFIX:-bcsw}
NET=${SWARM_HOSTS_NET:-198.18.77}
TIMEOUT=${SWARM_HOSTS_TIMEOUT:-60}
# the hosts that run an engine (default all), and whether they form a swarm (1) or
# stay plain engines (0: the remote-worker case, whose worker host runs no engine)
ENGINES=${SWARM_HOSTS_ENGINES:-}
SWARM=${SWARM_HOSTS_SWARM:-1}
# host N's docker0 is 198.19.(BIP_BASE+N).1/24, its local networks 198.19.(POOL_BASE+16N).0/20:
# another set of hosts running beside these one picks other bases
BIP_BASE=${SWARM_HOSTS_BIP_BASE:-0}
POOL_BASE=${SWARM_HOSTS_POOL_BASE:-0}
LAN=$PREFIX-lan

hosts() {
    i=1
    while [ "$i" -le "$COUNT" ]; do
        echo "h$i"
        i=$((i + 1))
    done
}

number() { echo "${1#h}"; }

has_engine() {  # $1 host: does it run a Docker engine
    [ -z "$ENGINES" ] && return 0
    case ",$ENGINES," in *",$1,"*) return 0 ;; esac
    return 1
}

engine_hosts() {
    for h in $(hosts); do
        if has_engine "$h"; then echo "$h"; fi
    done
}

address() { echo "$NET.$((10 + $(number "$1")))"; }

netns() { echo "$PREFIX-$1"; }

sock() { echo "unix://$DIR/$1/docker.sock"; }

pid_of() {  # $1 host, $2 program (dockerd or containerd): its pid while it runs
    file="$DIR/$1/$2.pid"
    [ -f "$file" ] || return 1
    pid=$(cat "$file")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "^[^ ]*$2 " || return 1
    echo "$pid"
}

wait_gone() {  # $1 pid, $2 seconds: SIGKILL when still there after
    waited=0
    while [ -d "/proc/$1" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q .; do
        if [ "$waited" -ge "$(($2 * 2))" ]; then
            kill -KILL "$1" 2>/dev/null || true
            sleep 0.5
            return 0
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
}

descendants() {  # every descendant pid of $1
    for child in $(cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="$1" '$4 == p { print $1 }'); do
        echo "$child"
        descendants "$child"
    done
}

shims_of() {  # the containerd shims whose socket lives under $1's state (reparented to 1)
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        cmd=$( (tr '\0' ' ' <"/proc/$pid/cmdline") 2>/dev/null) || continue
        case "$cmd" in
            *containerd-shim*"$DIR/$1/containerd.sock"*) echo "$pid" ;;
        esac
    done
}

start_engine() {  # $1 host
    h=$1
    n=$(number "$h")
    d=$DIR/$h
    mkdir -p "$d"
    if ! pid_of "$h" containerd >/dev/null; then
        cat >"$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd-root"
state = "$d/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$d/containerd.sock"
[debug]
  address = ""
[metrics]
  address = ""
EOF
        nsenter --net="/run/netns/$(netns "$h")" setsid containerd --config "$d/containerd.toml" \
            >"$d/containerd.log" 2>&1 </dev/null &
        echo $! >"$d/containerd.pid"
    fi
    if ! pid_of "$h" dockerd >/dev/null; then
        rm -f "$d/docker.sock"
        # nsenter --net, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts
        # a UTS namespace too, so each node has its host name (h1 ...) in `docker node ls`
        # DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1: a swarm task runs the image loaded here
        # without asking a registry first (these hosts have none, and no route out: where a
        # lookup hangs rather than fails, each task would wait in Preparing)
        nsenter --net="/run/netns/$(netns "$h")" unshare --uts setsid sh -c \
            'hostname "$0"; exec "$@"' "$h" env DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 dockerd \
            --data-root "$d/data" --exec-root "$d/exec" --pidfile "$d/dockerd.pid.own" \
            -H "$(sock "$h")" --containerd "$d/containerd.sock" \
            --bip "198.19.$((BIP_BASE + n)).1/24" \
            --default-address-pool "base=198.19.$((POOL_BASE + 16 * n)).0/20,size=24" \
            --log-level warn >"$d/dockerd.log" 2>&1 </dev/null &
        echo $! >"$d/dockerd.pid"
    fi
}

wait_engine() {  # $1 host
    waited=0
    until docker -H "$(sock "$1")" info >/dev/null 2>&1; do
        # alive is enough: for its first moments its command line is still nsenter's
        pid=$(cat "$DIR/$1/dockerd.pid")
        if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q .; then
            echo "dockerd of $1 exited; last lines of $DIR/$1/dockerd.log:" >&2
            tail -n 20 "$DIR/$1/dockerd.log" >&2
            exit 1
        fi
        if [ "$waited" -ge "$((TIMEOUT * 2))" ]; then
            echo "dockerd of $1 did not answer within ${TIMEOUT}s; see $DIR/$1/dockerd.log" >&2
            exit 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
}

stop_host() {  # $1 host, $2 signal for dockerd (TERM: stops its containers first)
    h=$1
    if pid=$(pid_of "$h" dockerd); then
        kill "-$2" "$pid" 2>/dev/null || true
        wait_gone "$pid" "$TIMEOUT"
    fi
    if pid=$(pid_of "$h" containerd); then
        shims=$(shims_of "$h")
        kill "-$2" "$pid" 2>/dev/null || true
        wait_gone "$pid" 30
        for shim in $shims; do
            for p in $(descendants "$shim") "$shim"; do kill -KILL "$p" 2>/dev/null || true; done
        done
    fi
    rm -f "$DIR/$h/dockerd.pid" "$DIR/$h/containerd.pid"
}

unmount_under() {  # every mount under $1, deepest first
    awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

case "${1:-}" in
start)
    scripts/ensure-system-packages.sh dockerd=docker.io nsenter=util-linux
    mkdir -p "$DIR"
    ip netns add "$LAN" 2>/dev/null || true
    ip -n "$LAN" link add br0 type bridge 2>/dev/null || true
    ip -n "$LAN" link set lo up
    ip -n "$LAN" link set br0 up
    for h in $(hosts); do
        ns=$(netns "$h")
        ip netns add "$ns" 2>/dev/null || true
        if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
            ip -n "$LAN" link add "$h" type veth peer name eth0 netns "$ns"
            ip -n "$LAN" link set "$h" master br0 up
            ip -n "$ns" addr add "$(address "$h")/24" dev eth0
        fi
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        if has_engine "$h"; then start_engine "$h"; fi
    done
    for h in $(engine_hosts); do wait_engine "$h"; done
    if [ "$SWARM" != 1 ]; then
        echo "$COUNT hosts up; engines: $(engine_hosts | tr '\n' ' ')"
        exit 0
    fi
    manager=$(sock h1)
    if [ "$(docker -H "$manager" info --format '{{.Swarm.LocalNodeState}}')" != active ]; then
        docker -H "$manager" swarm init --advertise-addr "$(address h1)" \
            --listen-addr "$(address h1):2377" --default-addr-pool 198.19.128.0/17 \
            --default-addr-pool-mask-length 24 >/dev/null
    fi
    token=$(docker -H "$manager" swarm join-token -q worker)
    for h in $(hosts); do
        [ "$h" = h1 ] && continue
        if [ "$(docker -H "$(sock "$h")" info --format '{{.Swarm.LocalNodeState}}')" != active ]; then
            docker -H "$(sock "$h")" swarm join --token "$token" \
                --advertise-addr "$(address "$h")" --listen-addr "$(address "$h"):2377" \
                "$(address h1):2377" >/dev/null
        fi
    done
    echo "swarm of $COUNT hosts up; manager: DOCKER_HOST=$manager"
    ;;
kill)
    h=${2:?usage: $0 kill HOST}
    ip -n "$(netns "$h")" link set eth0 down
    stop_host "$h" KILL
    ;;
revive)
    h=${2:?usage: $0 revive HOST}
    ip -n "$(netns "$h")" link set eth0 up
    unmount_under "$DIR/$h"
    start_engine "$h"
    wait_engine "$h"
    ;;
stop)
    for h in $(engine_hosts); do stop_host "$h" TERM; done
    unmount_under "$DIR"
    for h in $(hosts); do ip netns del "$(netns "$h")" 2>/dev/null || true; done
    ip netns del "$LAN" 2>/dev/null || true
    rm -rf "$DIR"
    ;;
status)
    for h in $(hosts); do
        if ! has_engine "$h"; then
            echo "$h $(address "$h") no engine"
        elif pid=$(pid_of "$h" dockerd); then
            echo "$h $(address "$h") dockerd $pid $(sock "$h")"
        else
            echo "$h $(address "$h") down"
        fi
    done
    ;;
*)
    echo "usage: $0 start|stop|status|kill HOST|revive HOST" >&2
    exit 2
    ;;
esac
