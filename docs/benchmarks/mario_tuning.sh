#!/usr/bin/env bash
# Tuning runs for Mario on 2 cores: 10 min of flywheel run per config, training seed 11 (tuning set).
set -u
cd /work/main
run() {  # name env extra-args...
  local name=$1 env=$2; shift 2
  rm -rf /work/tune/$name
  echo "== $name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 900 .venv/bin/flywheel run --env "$env" --time-limit 600 --checkpoint-dir /work/tune/$name \
     --base-port 7555 --http-port 8282 --progress-interval 30 --set actor.seed=11 --set learner.seed=11 "$@" \
     > /work/tune/$name.progress 2>&1
  echo "== $name end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  tail -3 /work/tune/$name.progress
}
run a84 "SuperMarioBros-1-1-v0" --actors 1 --envs-per-actor 8
run b42 "SuperMarioBros-1-1-v0?size=42" --actors 1 --envs-per-actor 8 --set replay.samples_per_insert=8
