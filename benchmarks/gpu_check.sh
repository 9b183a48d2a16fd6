#!/usr/bin/env bash
# GPU check for the LLM engine: CUDA/bf16 greedy vs CPU/fp32 on SmolLM2, then decode tokens/s at
# 1/32/128 streams. Meant to finish in under five minutes on one GPU. Needs the repo's venv (make install)
# with a CUDA build of torch. NOT run during development (no GPU was available) — treat its first run as
# the first real test of the CUDA path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
timeout 300 "$PY" benchmarks/llm/gpu_check.py
