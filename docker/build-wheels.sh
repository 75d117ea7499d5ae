#!/bin/sh
# Build wheels for flywheel-rl and every dependency into $1 (run inside the Docker builder stages).
#
# Source of packages, in order:
#   1. $WHEELHOUSE (a folder in the build context) when it holds any *.whl / *.tar.gz: fully offline,
#      `pip wheel --no-index --find-links $WHEELHOUSE` (it must then hold every dependency, torch and the
#      build requirements setuptools + wheel included; see docs/DEPLOY.md "Offline builds").
#   2. otherwise the index: $PIP_INDEX_URL, plus $TORCH_INDEX_URL as an extra index when set
#      (https://download.pytorch.org/whl/cpu gives the small CPU-only torch: 2.13.0+cpu sorts above 2.13.0).
# Versions are pinned by docker/constraints.txt in both cases.
set -eu

out="$1"
python=${PYTHON:-python}
constraints=docker/constraints.txt
wheelhouse=${WHEELHOUSE:-wheelhouse}

if [ -d "$wheelhouse" ] && find "$wheelhouse" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' \) | grep -q .; then
    echo "build-wheels: offline, from the wheelhouse $wheelhouse"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$(pwd)/$wheelhouse"
    set -- --no-index --find-links "$wheelhouse"
else
    echo "build-wheels: from the index ${PIP_INDEX_URL:-https://pypi.org/simple} ${TORCH_INDEX_URL:+(torch extra index $TORCH_INDEX_URL)}"
    set -- --index-url "${PIP_INDEX_URL:-https://pypi.org/simple}"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        set -- "$@" --extra-index-url "$TORCH_INDEX_URL"
    fi
fi

# PIP_CONSTRAINT also reaches the isolated build environments (setuptools for flywheel-rl and nes-py).
PIP_CONSTRAINT="$(pwd)/$constraints" "$python" -m pip wheel "$@" --constraint "$constraints" --wheel-dir "$out" .
