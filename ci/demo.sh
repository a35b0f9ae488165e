#!/usr/bin/env bash
# The main job on the bundled default (README): builds or reuses the pinned environment, prints the ops and
# the Kernel Coverage table, and checks every op's kernel against its PyTorch reference on this machine
# (through Triton's interpreter when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash ci/envs/vllm_cpu.sh)
export PATH="$VENV/bin:$PATH"
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || export TRITON_INTERPRET=1
sk list
sk selfcheck
