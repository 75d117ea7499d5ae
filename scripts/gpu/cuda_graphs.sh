#!/bin/bash
# CUDA graphs against eager on the lent GPU machine, then the learner bench with reduce-overhead (see bench_learner.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/pkg && cp -r flywheel /tmp/pkg/ && cp -r proto services /tmp/pkg/flywheel/ || exit 3
cp scripts/gpu/cuda_graphs_check.py /tmp/cuda_graphs_check.py
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1; cd /tmp
timeout 80 python3 /tmp/cuda_graphs_check.py cuda 2>&1 | grep -v Warn | tail -45
timeout 150 python3 -m flywheel bench learner --opt device=cuda --opt cases=nature512 --opt compile_mode=reduce-overhead \
  --runs 3 --warmup 1 --out $OUT/ro 2>&1 | tee $OUT/ro.log | tail -25
cp $OUT/ro/learner.json $OUT/reduce_overhead.json; cp $OUT/ro/learner.md $OUT/reduce_overhead.md; rm -rf $OUT/ro
