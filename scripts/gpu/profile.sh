#!/bin/bash
# The learner profile on the lent GPU machine (.whl/ holds the wheels its image lacks; see bench_learner.sh).
set -u
source scripts/gpu/setup.sh
(uptime; nproc) > $OUT/machine2.txt
timeout 330 python3 /tmp/learner_profile.py cuda 2>&1 | tee $OUT/prof.log | grep -v Warning | tail -80
uptime >> $OUT/machine2.txt
