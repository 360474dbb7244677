#!/bin/sh
# Entrypoint of the compose Redis: render the ACL template, then start Redis as the image does.
#
# The template (docker/redis/users.acl, from `fedasync acl`) names each user's password as a
# ${REDIS_PASSWORD_<USER>} token, which Redis itself refuses to load. Each token becomes
# ">password" from that environment variable; a missing or unusable password stops the start
# rather than leaving a user with a guessable one. Passwords go into Redis URLs too, so only
# URL-unreserved characters are accepted (`fedasync acl --new-passwords` makes suitable ones).
set -eu
template=${ACL_TEMPLATE:-/usr/local/etc/redis/users.acl.template}
target=${ACL_FILE:-/usr/local/etc/redis/users.acl}

fail() {
    echo "redis entrypoint: $*" >&2
    exit 1
}

password() {
    eval "value=\${$1-}"
    case $value in
        '') fail "$1 is not set (see docs/security.md, Redis users)" ;;
        *[!A-Za-z0-9._~-]*) fail "$1: use only A-Z a-z 0-9 . _ ~ -" ;;
    esac
    [ ${#value} -ge 16 ] || fail "$1: 16 characters or more"
    printf '%s' "$value"
}

render() {
    set -f # words like ~{fedasync}:* are rules, not file globs
    while IFS= read -r line || [ -n "$line" ]; do
        out=""
        for word in $line; do
            case $word in
                '${'*'}')
                    name=${word#??}
                    name=${name%?}
                    case $name in '' | *[!A-Z0-9_]*) fail "bad placeholder $word" ;; esac
                    word=">$(password "$name")" || exit 1
                    ;;
            esac
            out="$out${out:+ }$word"
        done
        printf '%s\n' "$out"
    done <"$template"
    set +f
}

umask 077
trap 'rm -f "$target.tmp"' EXIT
render >"$target.tmp"
if [ "$(id -u)" = 0 ] && id redis >/dev/null 2>&1; then
    chown redis:redis "$target.tmp" # the image's entrypoint drops to the redis user
fi
mv "$target.tmp" "$target"

# Durable mode on the server (docker-compose.yml sets REDIS_MIN_REPLICAS_TO_WRITE: the services'
# FEDASYNC_REDIS__DURABLE_REPLICAS, or 1 when Sentinels are configured): take a write only while
# that many replicas acknowledged the replication stream within the last 4 s, below Sentinel's
# down-after (5 s), so that a primary cut off from its replicas, or paused and resumed after
# they moved on, refuses writes (NOREPLICAS) instead of acknowledging what the new primary
# lacks. Empty or 0: none (a lone server). The figure 4 is SHIPPED_MIN_REPLICAS_MAX_LAG_S in
# services/commands/redis_launch/sentinel.py, which the chaos harness runs the same way.
min_replicas=${REDIS_MIN_REPLICAS_TO_WRITE:-0}
case $min_replicas in '' | *[!0-9]*) fail "REDIS_MIN_REPLICAS_TO_WRITE: a number, not $min_replicas" ;; esac
if [ "${1-}" = redis-server ] && [ "$min_replicas" -gt 0 ]; then
    set -- "$@" --min-replicas-to-write "$min_replicas" --min-replicas-max-lag 4
fi
exec docker-entrypoint.sh "$@"
