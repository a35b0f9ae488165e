#!/usr/bin/env bash
# The test command (README, .ci/run): builds or reuses the pinned environment, then runs the whole suite.
# On a machine without a GPU the Triton kernels run through Triton's interpreter and GPU-only tests skip;
# on a GPU machine use ci/gpu/run.sh instead (it adds the benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash ci/envs/vllm_cpu.sh)
# Every engine venv before the tests: each venv's first editable install empties and rebuilds the checkout's one
# link tree (build/__editable__.*, ci/envs/_venv.sh), and a vLLM engine process importing `sk` from it meanwhile
# failed with "No module named 'sk.warmup'" (a fresh-cache CI run, 2026-12-07).
bash ci/envs/sglang.sh > /dev/null || echo "ci/test.sh: the SGLang venv did not build; its tests say why" >&2
export PATH="$VENV/bin:$PATH"
# --durations: the slowest 25 tests listed, since CI must stay well inside its 90 minutes. Two workers (CI's two
# cores; a single run left one idle while engines started), each taking whole files (--dist loadfile), so a
# file's module-scoped engine runs happen once, in one worker.
exec python -m pytest -q -p no:cacheprovider --durations=25 -n 2 --dist loadfile "$@" tests
