#!/bin/sh
# One-shot maker of the compose Redis Cluster (profile `cluster`, service redis-cluster-create):
# three primaries and three replicas out of the nodes in CLUSTER_NODES, made once. Run again on
# a cluster that exists (every later `docker compose up`), it changes nothing and exits 0; the
# services start only once it has (depends_on: service_completed_successfully).
#
# It logs in to every node as `cluster-admin` (docker/redis/users-cluster.acl), whose password is
# REDIS_PASSWORD_CLUSTER_ADMIN; redis-cli reads it from REDISCLI_AUTH, never from its arguments.
# `redis-cli --cluster create` sends CLUSTER MEET, which takes an IP address, not a name: each
# node's name is resolved here. The nodes announce their names (cluster-announce-hostname), so
# clients are sent to redis-node-N whatever address the engine gives it after a restart.
set -eu

fail() {
    echo "redis-cluster-create: $*" >&2
    exit 1
}

nodes=${CLUSTER_NODES:?CLUSTER_NODES: the nodes, host:port separated by spaces}
user=${CLUSTER_ADMIN_USER:-cluster-admin}
REDISCLI_AUTH=${REDIS_PASSWORD_CLUSTER_ADMIN:?REDIS_PASSWORD_CLUSTER_ADMIN is not set (see docs/security.md, Redis users)}
export REDISCLI_AUTH
settle_s=${CLUSTER_SETTLE_S:-60}

ask() {
    node=$1
    shift
    redis-cli -h "${node%:*}" -p "${node##*:}" --user "$user" --no-auth-warning "$@"
}

# `field NODE NAME`: NAME of the node's CLUSTER INFO
field() {
    info=$(ask "$1" cluster info) || fail "$1 does not answer CLUSTER INFO as $user"
    printf '%s\n' "$info" | tr -d '\r' | sed -n "s/^$2://p"
}

# every node says cluster_state:ok (slots assigned and agreed); fails after settle_s seconds
settled() {
    waited=0
    for node in $nodes; do
        while :; do
            state=$(field "$node" cluster_state)
            [ "$state" != ok ] || break
            [ "$waited" -lt "$settle_s" ] || fail "$node: cluster_state is $state after ${settle_s} s"
            sleep 1
            waited=$((waited + 1))
        done
    done
}

empty=""
formed=""
for node in $nodes; do
    # assignments, so that a node that does not answer stops the script (set -e)
    known=$(field "$node" cluster_known_nodes)
    slots=$(field "$node" cluster_slots_assigned)
    if [ "$known" = 1 ] && [ "$slots" = 0 ]; then
        empty="$empty $node"
    else
        formed="$formed $node"
    fi
done

if [ -n "$formed" ]; then
    # made before: its nodes keep the cluster in their nodes.conf (their /data volumes)
    [ -z "$empty" ] || fail "part of a cluster:$formed, and nodes outside it:$empty" \
        "(a node lost its volume? add it back with redis-cli --cluster add-node)"
    settled
    echo "redis-cluster-create: the cluster exists:$formed; nothing to do"
    exit 0
fi

addresses=""
for node in $nodes; do
    # `getent hosts NAME` prints "ADDRESS NAME..."
    # shellcheck disable=SC2046
    set -- $(getent hosts "${node%:*}") ""
    [ -n "$1" ] || fail "cannot resolve ${node%:*}"
    addresses="$addresses $1:${node##*:}"
done
echo "redis-cluster-create: making the cluster of$addresses"
# shellcheck disable=SC2086
redis-cli --user "$user" --no-auth-warning --cluster create $addresses --cluster-replicas 1 \
    --cluster-yes
settled
echo "redis-cluster-create: the cluster is made"
