#!/bin/sh
# Join the compose Redis Cluster's nodes (docker-compose.cluster.yml's
# redis-cluster-init service); safe to run on every `up`.
#
# REDIS_CLUSTER_NODES  "host:port host:port ..." (compose service names)
# REDIS_CLUSTER_REPLICAS  replicas per master (1)
# REDISCLI_AUTH        the nodes' password
#
# 1. waits until every node answers PING;
# 2. no node has a slot: a new cluster, `redis-cli --cluster create` (it takes
#    IP addresses: CLUSTER MEET does not resolve names; the nodes announce their
#    names to clients themselves);
# 3. else the cluster was made before (its nodes.conf kept on the volumes) and
#    its nodes may be back on new addresses (a node remembers its peers by IP):
#    each node is sent CLUSTER MEET with every other node's current address,
#    which a node that already knows the other's id takes as its new address
#    (harmless when nothing moved);
# then waits until the cluster is healthy: every node reports cluster_state:ok
# and sees all the nodes connected, none failing, three checks in a row. Exits
# 1 (with `redis-cli --cluster check`) when that takes longer than
# REDIS_CLUSTER_INIT_TIMEOUT seconds (120).
set -eu
NODES=${REDIS_CLUSTER_NODES:?set REDIS_CLUSTER_NODES}
REPLICAS=${REDIS_CLUSTER_REPLICAS:-1}
TIMEOUT=${REDIS_CLUSTER_INIT_TIMEOUT:-120}
deadline=$(($(date +%s) + TIMEOUT))

cli() {  # cli HOST:PORT ARGS...
    cli_node=$1
    shift
    redis-cli --no-auth-warning -h "${cli_node%:*}" -p "${cli_node##*:}" "$@"
}

info_field() {  # info_field HOST:PORT FIELD: a field of CLUSTER INFO, empty when unreachable
    cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

address_of() {  # address_of HOST:PORT: IP:PORT
    ip=$(getent hosts "${1%:*}" | awk '{ print $1; exit }')
    [ -n "$ip" ] || { echo "cannot resolve ${1%:*}" >&2; return 1; }
    echo "$ip:${1##*:}"
}

in_time() {
    [ "$(date +%s)" -lt "$deadline" ]
}

healthy() {  # every node: cluster_state:ok, all nodes known, connected, none failing
    count=$(echo $NODES | wc -w)
    for node in $NODES; do
        [ "$(info_field "$node" cluster_state)" = ok ] || return 1
        view=$(cli "$node" cluster nodes 2>/dev/null | tr -d '\r') || return 1
        [ "$(echo "$view" | grep -c .)" = "$count" ] || return 1
        echo "$view" | awk '$8 != "connected" || $3 ~ /fail|handshake|noaddr/ { bad = 1 }
                            END { exit bad }' || return 1
    done
}

for node in $NODES; do
    until [ "$(cli "$node" ping 2>/dev/null)" = PONG ]; do
        in_time || { echo "$node did not answer PING within ${TIMEOUT}s" >&2; exit 1; }
        sleep 1
    done
done

assigned=0
for node in $NODES; do
    slots=$(info_field "$node" cluster_slots_assigned)
    if [ "${slots:-0}" -gt "$assigned" ]; then assigned=$slots; fi
done

if [ "$assigned" = 0 ]; then
    addresses=""
    for node in $NODES; do
        addresses="$addresses $(address_of "$node")"
    done
    echo "creating the cluster:$addresses, $REPLICAS replica(s) per master"
    # shellcheck disable=SC2086
    redis-cli --no-auth-warning --cluster create $addresses \
        --cluster-replicas "$REPLICAS" --cluster-yes
else
    echo "the cluster exists ($assigned slots assigned): introducing every node at its current address"
    for node in $NODES; do
        for other in $NODES; do
            [ "$node" = "$other" ] && continue
            address=$(address_of "$other")
            cli "$node" cluster meet "${address%:*}" "${address##*:}" >/dev/null
        done
    done
fi

good=0
while [ "$good" -lt 3 ]; do
    if healthy; then
        good=$((good + 1))
    else
        good=0
        if ! in_time; then
            echo "the cluster is not healthy after ${TIMEOUT}s:" >&2
            first=${NODES%% *}
            redis-cli --no-auth-warning --cluster check "$(address_of "$first")" >&2 || true
            exit 1
        fi
    fi
    sleep 1
done
echo "the cluster is up:"
cli "${NODES%% *}" cluster nodes | awk '{ print "  " $2, $3 }'
