#!/bin/bash
# The services' healthcheck: GET one URL on the container's own loopback through bash's
# /dev/tcp, healthy on a 200. Milliseconds of CPU, no interpreter to start and nothing to
# import: under load a `python -c "import urllib.request; ..."` probe took longer than its 3 s
# timeout, again and again, while the service answered /readyz in 0.01-0.3 s (issue 25). bash
# is in python:3.11-slim and in every Debian image; curl and wget are not.
#
#   http-probe http://127.0.0.1:8090/readyz [seconds to wait for the status line, default 5]
set -u
url=${1:?usage: http-probe http://HOST:PORT/PATH [seconds]}
wait_s=${2:-5}
rest=${url#http://}
authority=${rest%%/*}
path=${rest#"$authority"}
path=/${path#/}
host=${authority%:*}
port=${authority##*:}
exec 3<>"/dev/tcp/$host/$port" || exit 1
printf 'GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$authority" >&3
read -r -t "$wait_s" _ status _ <&3 || exit 1
[ "$status" = 200 ] || { echo "$url answered $status"; exit 1; }
