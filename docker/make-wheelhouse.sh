#!/bin/sh
# Fill a wheelhouse (default docker/wheelhouse) with a wheel of every package the images install, so that
# `docker build` needs no package index (docs/DEPLOY.md "Offline builds").
#
#   docker/make-wheelhouse.sh [DIR]
#
# Run it on Linux x86_64 with the same Python minor version as the image (3.11 for python:3.11-slim and Debian
# bookworm; PYTHON=python3.11 picks the interpreter). It uses `pip wheel`, not `pip download`, because nes-py
# is published as an sdist only: its C++ extension is compiled here, so the image build needs no compiler.
# The host's pip configuration applies (a mirror, find-links with a local CPU torch wheel); elsewhere set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU build of torch, or .../cu128 for CUDA.
set -eu
cd "$(dirname "$0")/.."
out=${1:-docker/wheelhouse}
python=${PYTHON:-python3}
want=${IMAGE_PYTHON:-3.11}

have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$have" != "$want" ]; then
    echo "make-wheelhouse: $python is Python $have but the image runs $want; set PYTHON=python$want" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" docker/requirements.py > "$tmp/requirements.txt"
mkdir -p "$out"
"$python" -m pip wheel --wheel-dir "$out" --constraint docker/constraints.txt \
    ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
    --requirement "$tmp/requirements.txt"
echo "make-wheelhouse: $(find "$out" -maxdepth 1 -name '*.whl' | wc -l) wheels in $out"
