# Shared by the ci/envs/<engine>.sh scripts (source it): a venv built from a full pip lock, reused while
# unchanged, with this checkout installed editable so that our entry points (engine plugins, sk-serve) register.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
#   sk_locked_venv NAME LOCK [POST_INSTALL_FUNCTION]      # prints the venv's path on stdout
#
# The venv lives in ${SK_CACHE_DIR:-~/.cache/standardkernels}/NAME-<hash>, the hash taken over the lock, the
# calling script and this file, so a changed pin or install step builds a fresh venv and an unchanged one is
# reused as is. Everything is installed from the lock with --no-deps: what CI gets is exactly what was tested.
# The checkout itself is installed editable (strict mode, see below), redone when its files change.
# POST_INSTALL_FUNCTION (a shell function of the caller) runs once, with the venv path, after the install.
# Progress goes to stderr; stdout carries only the path.

sk_locked_venv() {
    local name=$1 lock=$2 post_install=${3:-}
    local repo hash venv
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    hash=$(cat "$lock" "${BASH_SOURCE[1]}" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
    venv="${SK_CACHE_DIR:-$HOME/.cache/standardkernels}/$name-$hash"
    mkdir -p "$(dirname "$venv")"
    # One builder at a time: the test workers (ci/test.sh) may ask for the same venv together.
    exec 9>"$venv.lock"
    if command -v flock >/dev/null; then flock 9; fi

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

    # The checkout is installed in setuptools' strict editable mode: a tree of links to our files under
    # build/__editable__.*, on sys.path through a .pth file, so that editors and type checkers resolve `sk.*`
    # (pyproject.toml maps sk -> sk_core/, sk.adapters -> adapters/). Such a tree lists files, not folders:
    # it is redone whenever the checkout, pyproject.toml or the set of package files changes.
    local stamp
    stamp=$(cd "$repo" && { echo "$repo"; cat pyproject.toml; git ls-files -co --exclude-standard -- \
        sk_core adapters standardkernels models/trained 2>/dev/null || find sk_core adapters standardkernels \
        models/trained -type f; } | sha256sum | cut -c1-16)
    if [[ "$(cat "$venv/.sk-editable" 2>/dev/null)" != "$stamp" ]]; then
        echo "[$name] installing $repo (strict editable) into $venv" >&2
        "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
            --config-settings editable_mode=strict -e "$repo" >&2
        echo "$stamp" > "$venv/.sk-editable"
    fi
    exec 9>&-
    echo "$venv"
}
