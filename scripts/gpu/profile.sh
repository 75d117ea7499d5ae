#!/bin/bash
# The learner profile on the lent GPU machine (.whl/ holds the wheels its image lacks; see bench_learner.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/pkg && cp -r flywheel /tmp/pkg/ && cp -r proto services /tmp/pkg/flywheel/ || exit 3
cp scripts/gpu/learner_profile.py /tmp/learner_profile.py
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1; cd /tmp
(uptime; nproc) > $OUT/machine2.txt
timeout 330 python3 /tmp/learner_profile.py cuda 2>&1 | tee $OUT/prof.log | grep -v Warning | tail -80
uptime >> $OUT/machine2.txt
