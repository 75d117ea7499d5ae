#!/bin/sh
# Create /opt/venv with every pinned dependency of flywheel-rl (builder stage of docker/Dockerfile, as root).
#
#   install-venv.sh REQUIREMENTS_FILE        (written by docker/requirements.py from pyproject.toml)
#
# Where packages come from:
#   - docker/wheelhouse when it holds *.whl: fully offline (--no-index --find-links); it must hold a wheel for
#     every package (docker/make-wheelhouse.sh builds them on the host, nes-py included).
#   - otherwise $PIP_INDEX_URL, plus $TORCH_INDEX_URL as an extra index when set; a C++ compiler is installed
#     first because nes-py is published as an sdist only.
# Versions: docker/constraints.txt pins every package either way.
set -eu

requirements=$1
venv=/opt/venv
wheelhouse=docker/wheelhouse
constraints=docker/constraints.txt

python3 -m venv "$venv"
pip="$venv/bin/python -m pip"

wheels=$(find "$wheelhouse" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$wheels" -gt 0 ]; then
    echo "install-venv: from the wheelhouse ($wheels wheels), no index"
    $pip install --no-index --find-links "$wheelhouse" --constraint "$constraints" --requirement "$requirements"
else
    index=${PIP_INDEX_URL:-https://pypi.org/simple}
    echo "install-venv: from $index${TORCH_INDEX_URL:+ (torch from $TORCH_INDEX_URL)}"
    include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    packages="build-essential"
    [ -f "$include/Python.h" ] || packages="$packages python3-dev"
    apt-get update
    # shellcheck disable=SC2086  # a list of package names
    apt-get install -y --no-install-recommends $packages
    rm -rf /var/lib/apt/lists/*
    $pip install --index-url "$index" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        --constraint "$constraints" --requirement "$requirements"
fi
