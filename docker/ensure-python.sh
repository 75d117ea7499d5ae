#!/bin/sh
# Make sure the image has a python3 that can create venvs (run as root in the first stage of docker/Dockerfile).
# python:3.11-slim and the debootstrap base (python3 + python3-venv) already have one: nothing is installed.
# A CUDA base image (nvidia/cuda:*-ubuntu*) has none: python3 and python3-venv come from its apt sources.
set -eu
if command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip, tomllib' >/dev/null 2>&1; then
    echo "ensure-python: $(python3 --version) with venv is there"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-python: BASE_IMAGE has no python3 >= 3.11 with venv and no apt-get to install one" >&2
    exit 1
fi
echo "ensure-python: installing python3 and python3-venv with apt"
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv ca-certificates
rm -rf /var/lib/apt/lists/*
python3 -c 'import venv, ensurepip, tomllib'  # tomllib: Python 3.11 or newer
