#!/bin/bash
# Sourced by the scripts beside it on the lent GPU machine: install the wheels its image lacks (.whl/, carried; see
# bench_learner.sh for how they are downloaded), lay the package out as setuptools maps it (proto/ and services/
# under flywheel/) in /tmp/pkg, copy this folder's Python scripts to /tmp, and run from /tmp (the checkout's
# flywheel/ lacks proto and services).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/pkg && cp -r flywheel /tmp/pkg/ && cp -r proto services /tmp/pkg/flywheel/ || exit 3
cp scripts/gpu/*.py /tmp/
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
cd /tmp || exit 3
