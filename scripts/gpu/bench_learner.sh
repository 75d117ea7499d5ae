#!/bin/bash
# GPU learner benchmark on the lent machine: check imports, run the suite, then the staging breakdown.
# The image has torch 2.11 (CUDA) but not pyzmq, pydantic(-settings), cramjam, gymnasium: .whl/ carries them,
# downloaded here for Python 3.12 with `pip download --only-binary=:all: --python-version 3.12 ...` (the device
# tool README); setup.sh installs them and lays the package out.
set -u
source scripts/gpu/setup.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; python3 -V;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; nproc; uptime;
  lscpu | grep 'Model name'; } 2>&1 | tee $OUT/machine.txt
python3 -c "import flywheel.cli, flywheel.bench.suites.learner, flywheel.services.replay.main" || exit 4
# 1) the goal case: Nature CNN 4x84x84, batch 512, bf16, torch.compile (the defaults on a GPU)
timeout 240 python3 -m flywheel bench learner --opt device=cuda --opt cases=nature512,nature32 --runs 3 --warmup 1 \
  --out $OUT/nature 2>&1 | tee $OUT/nature.log | tail -60
# 2) the MLP cases, then nature512 eager fp32 for contrast, as time allows
timeout 90 python3 -m flywheel bench learner --opt device=cuda --opt cases=mlp128,mlp512 --runs 3 --warmup 1 \
  --out $OUT/mlp 2>&1 | tee $OUT/mlp.log | tail -30
timeout 90 python3 -m flywheel bench learner --opt device=cuda --opt cases=nature512 --opt compile=0 \
  --opt precision=fp32 --runs 3 --warmup 1 --out $OUT/eager 2>&1 | tee $OUT/eager.log | tail -30
# 3) where a host batch's time goes on its way to the GPU (diagnostic: the stager against its parts)
timeout 90 python3 /tmp/staging_copies.py > $OUT/staging.json 2> /tmp/staging.err; cat $OUT/staging.json; tail -5 /tmp/staging.err
uptime >> $OUT/machine.txt
cd $OUT && for d in nature mlp eager; do [ -f $d/learner.json ] && cp $d/learner.json ${d}.json; [ -f $d/learner.md ] && cp $d/learner.md ${d}.md; done
cat */learner-logs/*.log > replay-logs.txt 2>/dev/null; cat nature.log mlp.log eager.log /tmp/staging.err > bench-logs.txt 2>/dev/null
rm -rf nature mlp eager nature.log mlp.log eager.log eager.md mlp.md; ls -la $OUT
