#!/bin/sh
# docker/wheelhouse.sh [PACKAGE ...]: put every wheel the two images install into docker/wheels/,
# so that they build with no package index (docs/operations.md, "Building without Docker Hub or
# PyPI"). Run it where pip reaches an index or a mirror; then, where nothing is reachable:
#
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels docker compose build
#
# It takes the build requirements, the dependencies and the `eval` and `worker` extras from
# pyproject.toml, and torch==2.13.0 as its CPU wheel (TORCH_INDEX_URL, default the PyTorch CPU
# index, or pip's configured find-links); a CUDA build stops it. PACKAGE arguments are added:
# a task of your own (TASK_PACKAGES, e.g. ./examples/custom-model) and its dependencies.
#
# The Python that resolves the requirements decides how environment markers come out, so it must
# be a 3.11 no newer than the base image's: a marker such as redis-py's
# `python_full_version < "3.11.3"` (async-timeout) adds a wheel only an older patch release
# needs. PYTHON names it; unset, the first python3.11 with pip that fits is taken (on PATH,
# /usr/bin, /usr/local/bin), checked against the base image (PYTHON_IMAGE, default
# python:3.11-slim) when that image is on the local Docker engine. A second run with the same
# inputs does nothing.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/docker/wheels
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
image=${PYTHON_IMAGE:-python:3.11-slim}

say() { echo "wheelhouse: $*" >&2; }

# The base image's Python version, when the image is here to ask (nothing is pulled).
image_py=
if command -v docker >/dev/null 2>&1 && docker image inspect "$image" >/dev/null 2>&1; then
    image_py=$(docker run --rm --network none --entrypoint python "$image" \
        -c 'import platform; print(platform.python_version())' 2>/dev/null || true)
fi
fits() { # PYTHON: a Python 3.11 with pip, not newer than the image's
    "$1" -m pip --version >/dev/null 2>&1 || return 1
    "$1" - "$image_py" <<'PY'
import platform, sys
mine = tuple(map(int, platform.python_version().split(".")))
image = tuple(map(int, sys.argv[1].split("."))) if sys.argv[1] else mine
sys.exit(0 if mine[:2] == (3, 11) and mine <= image else 1)
PY
}
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
    fits "$python" || {
        say "PYTHON=$python is no Python 3.11 with pip no newer than $image's (${image_py:-?})"
        exit 2
    }
else
    python=
    for candidate in "$(command -v python3.11 || true)" /usr/bin/python3.11 /usr/local/bin/python3.11; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] && fits "$candidate"; then
            python=$candidate
            break
        fi
    done
    [ -n "$python" ] || {
        say "no python3.11 with pip no newer than $image's (${image_py:-?}); set PYTHON"
        exit 2
    }
fi

# What the images install (docker/requirements.py, as the Dockerfiles read it), the PACKAGE
# arguments, and the Python that resolves them: a change to any of them makes a new wheelhouse.
requirements=$(
    echo "# python $("$python" -c 'import platform; print(platform.python_version())')"
    "$python" "$root/docker/requirements.py" --pyproject "$root/pyproject.toml" --build eval worker
    for package in "$@"; do echo "$package"; done
)
mkdir -p "$out"
if [ -f "$out/.requirements" ] && [ "$(cat "$out/.requirements")" = "$requirements" ]; then
    say "up to date ($(ls "$out" | grep -c '\.whl$') wheels in $out)"
    exit 0
fi
rm -f "$out/.requirements"
torch=$(printf '%s\n' "$requirements" | grep -E '^torch==' | head -n 1)
say "$torch, CPU build ($torch_index)"
"$python" -m pip download -q --no-deps --retries 1 -d "$out" --extra-index-url "$torch_index" "$torch"
ls "$out"/torch-*+cpu-*.whl >/dev/null 2>&1 || {
    say "no CPU build of $torch in $out; set TORCH_INDEX_URL to an index that serves it"
    exit 1
}
say "the rest ($python, $("$python" -c 'import platform; print(platform.python_version())'))"
printf '%s\n' "$requirements" | grep -v '^#' >"$out/requirements.txt"
"$python" -m pip wheel -q -w "$out" --find-links "$out" -r "$out/requirements.txt"
rm -f "$out/requirements.txt"
printf '%s\n' "$requirements" >"$out/.requirements"
say "$(ls "$out" | grep -c '\.whl$') wheels, $(du -sh "$out" | cut -f1) in $out"
