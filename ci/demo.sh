#!/usr/bin/env bash
# The main job on the bundled default (README): builds or reuses the pinned environment, prints the ops and
# the Kernel Coverage table, checks every op's kernel against its PyTorch reference on this machine (through
# Triton's interpreter when there is no GPU), then runs the end-to-end eval of scenarios/tiny.yaml: the
# project's trained models in the real vLLM engine, stock vs our kernels, throughput and latency summaries with
# token-for-token MATCH counts (short: 8 requests per throughput workload).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash ci/envs/vllm_cpu.sh)
export PATH="$VENV/bin:$PATH"
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || export TRITON_INTERPRET=1
sk list
sk selfcheck
# The engines run our ops through their PyTorch path on CPU (interpreted Triton would take minutes here).
env -u TRITON_INTERPRET sk eval scenarios/tiny.yaml --max-requests 8 --rounds 4 --out "${SK_DEMO_OUT:-results/tmp/demo}"
