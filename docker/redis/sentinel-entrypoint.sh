#!/bin/sh
# Entrypoint of a compose Sentinel (the `ha` profile, docs/operations.md).
#
# A Sentinel rewrites its configuration file with what it learns (the primary after a failover,
# the replicas, the other Sentinels), so the file is made once, in the Sentinel's volume, and a
# restart keeps it. It is made from two templates: docker/redis/sentinel.conf (what to watch, as
# whom), whose ${REDIS_PASSWORD_SENTINEL} is the `sentinel` user's password, and
# docker/redis/sentinel-users.acl (`fedasync acl --sentinel`: the Sentinel's own users), rendered
# by the servers' entrypoint (entrypoint.sh), which checks every password the same way.
set -eu
dir=${SENTINEL_DIR:-/data}
conf=$dir/sentinel.conf
templates=${SENTINEL_TEMPLATES:-/usr/local/etc/redis}

if [ ! -f "$conf" ]; then
    umask 077
    trap 'rm -f "$conf.tmp" "$dir/users.rendered"' EXIT
    # renders the users (refusing a missing or unusable password), then runs `true`
    ACL_TEMPLATE="$templates/sentinel-users.acl.template" ACL_FILE="$dir/users.rendered" \
        sh "$templates/entrypoint.sh" true
    # the password was checked above: URL-unreserved characters only, nothing sed would read
    sed "s|\${REDIS_PASSWORD_SENTINEL}|$REDIS_PASSWORD_SENTINEL|g" \
        "$templates/sentinel.conf.template" >"$conf.tmp"
    cat "$dir/users.rendered" >>"$conf.tmp"
    mv "$conf.tmp" "$conf"
fi
exec docker-entrypoint.sh redis-server "$conf" --sentinel
