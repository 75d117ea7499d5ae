#!/bin/bash
# learner.host_staging pinned against direct on the lent GPU machine: the learner bench's Nature CNN batch-512 case
# (fed by a replay over TCP, the core on host batches, device-resident) once per entry of ORDER (default
# "pinned direct"; e.g. ORDER="direct pinned direct" for an A-B-A check), then the staging breakdown.
set -u
source scripts/gpu/setup.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; uptime;
  lscpu | grep 'Model name'; } 2>&1 | tee $OUT/machine.txt
i=0
for staging in ${ORDER:-pinned direct}; do
  i=$((i + 1))
  timeout 150 python3 -m flywheel bench learner --opt device=cuda --opt cases=nature512 --opt host_staging=$staging \
    --runs 3 --warmup 1 --out /tmp/hs$i 2>&1 | tee -a /tmp/bench-logs.txt | grep -E "run [0-9]/|Error|error" | tail -8
  cp /tmp/hs$i/learner.json $OUT/host_staging_${i}_$staging.json
done
timeout 60 python3 /tmp/staging_copies.py > $OUT/staging.json 2>> /tmp/bench-logs.txt; cat $OUT/staging.json
uptime >> $OUT/machine.txt
cp /tmp/bench-logs.txt $OUT/bench-logs.txt
