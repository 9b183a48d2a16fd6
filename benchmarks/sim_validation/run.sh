#!/usr/bin/env bash
# `headroom sim --validate` on this machine: the simulator against the real server (docs/sim.md, last section).
# Usage: [TAG=name] benchmarks/sim_validation/run.sh [MODEL] [SECONDS_PER_LOAD] [more `headroom sim` options]
#   e.g. TAG=pinned benchmarks/sim_validation/run.sh minilm 30 --server-cpus 1 --generator-cpus 0
#   defaults: sleep 30. MODEL `sleep` lives in benchmarks/sim_validation/models (CPU-free compute: isolates the
#   queueing and batching the simulator models); other names come from ./models (minilm, digits).
# Writes benchmarks/results/sim_validation_<date>_<MODEL>[_<TAG>].json and prints the comparison table.
# Calibration (defaults): 200 single-stream requests, a 600-request closed-loop saturation check
# (--saturation-queries 0 to skip), 15 s open loop at 0.85 of capacity (--calibration-high-load: host CPU at
# larger batches) and 15 s at 0.15 (--calibration-load / --calibration-duration: the in-service slowdown and
# the judged costs). The loads are target utilisations (--load-basis capacity for fractions of capacity).
# Repeat 3 times and take medians: benchmarks/sim_validation/summarise.py OUT.json RUN1.json RUN2.json RUN3.json
# minilm, pinned, 20 s per load: about 2.5 minutes.
# Quiet the machine first: other processes on the cores add latency the simulator does not model
# (the load average is recorded in the JSON as environment.load_average).
set -euo pipefail
cd "$(dirname "$0")/../.."
model="${1:-sleep}"
seconds="${2:-30}"
shift $(( $# < 2 ? $# : 2 ))
repo="models"
if [ -d "benchmarks/sim_validation/models/$model" ]; then repo="benchmarks/sim_validation/models"; fi
out="benchmarks/results/sim_validation_$(date -u +%Y-%m-%d)_${model}${TAG:+_$TAG}.json"
uptime
status=0
.venv/bin/python -m headroom.cli.main sim --validate --model "$model" --model-repository "$repo" \
  --loads 0.3,0.5,0.7,0.9 --duration "$seconds" --seed 0 --json "$out" "$@" || status=$?
echo "wrote $out (exit $status: 0 = within target, 1 = target missed, 2 = error)"
