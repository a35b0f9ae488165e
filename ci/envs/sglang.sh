#!/usr/bin/env bash
# Create (or reuse) the venv with SGLang 0.5.17 for the SGLang adapter tests, and print its path.
#
#   VENV=$(bash ci/envs/sglang.sh)
#
# First build: about 4 minutes and 9 GB (SGLang pulls the CUDA build of torch 2.11.0 and its CUDA libraries;
# that torch also runs on CPU, which is all the tests need: SGLang's layer classes, not its engine).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
sk_locked_venv sglang "$(dirname "${BASH_SOURCE[0]}")/sglang.lock.txt"
