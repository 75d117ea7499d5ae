#!/bin/bash
# CUDA graphs against eager on the lent GPU machine, then the learner bench with reduce-overhead (see bench_learner.sh).
set -u
source scripts/gpu/setup.sh
timeout 80 python3 /tmp/cuda_graphs_check.py cuda 2>&1 | grep -v Warn | tail -45
timeout 150 python3 -m flywheel bench learner --opt device=cuda --opt cases=nature512 --opt compile_mode=reduce-overhead \
  --runs 3 --warmup 1 --out $OUT/ro 2>&1 | tee $OUT/ro.log | tail -25
cp $OUT/ro/learner.json $OUT/reduce_overhead.json; cp $OUT/ro/learner.md $OUT/reduce_overhead.md; rm -rf $OUT/ro
