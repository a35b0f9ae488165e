# Shared by the ci/envs/<engine>.sh scripts (source it): a venv built from a full pip lock, reused while
# unchanged, with this checkout installed editable so that our entry points (engine plugins, sk-serve) register.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
#   sk_locked_venv NAME LOCK [POST_INSTALL_FUNCTION]      # prints the venv's path on stdout
#
# The venv lives in ${SK_CACHE_DIR:-~/.cache/standardkernels}/NAME-<hash>, the hash taken over the lock, the
# calling script and this file, so a changed pin or install step builds a fresh venv and an unchanged one is
# reused as is. Everything is installed from the lock with --no-deps: what CI gets is exactly what was tested.
# POST_INSTALL_FUNCTION (a shell function of the caller) runs once, with the venv path, after the install.
# Progress goes to stderr; stdout carries only the path.

sk_locked_venv() {
    local name=$1 lock=$2 post_install=${3:-}
    local repo hash venv
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    hash=$(cat "$lock" "${BASH_SOURCE[1]}" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
    venv="${SK_CACHE_DIR:-$HOME/.cache/standardkernels}/$name-$hash"

    if [[ ! -f "$venv/.sk-complete" ]]; then
        # A venv without the marker is a broken earlier attempt: venvs cannot be moved, so rebuild in place.
        rm -rf "$venv"
        echo "[$name] building $venv from $(basename "$lock")" >&2
        "${PYTHON:-python3.11}" -m venv "$venv"
        "$venv/bin/python" -m pip install -q "$(grep '^pip==' "$lock")" >&2
        "$venv/bin/python" -m pip install -q --no-deps -r "$lock" >&2
        if [[ -n "$post_install" ]]; then
            "$post_install" "$venv"
        fi
        touch "$venv/.sk-complete"
    fi

    # Redone whenever the venv points at another checkout (CI clones the repo afresh next to a reused venv).
    if ! "$venv/bin/python" - "$repo" <<'EOF'
import json, sys
from importlib.metadata import distribution
try:
    url = json.loads(distribution("standardkernels").read_text("direct_url.json"))["url"]
except Exception:
    sys.exit(1)
sys.exit(0 if url == "file://" + sys.argv[1] else 1)
EOF
    then
        echo "[$name] installing $repo (editable) into $venv" >&2
        "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >&2
    fi
    echo "$venv"
}
