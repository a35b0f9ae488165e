#!/usr/bin/env bash
# QuACK (CuTe DSL) for the GPU host, which has no package index:
#   bash ci/gpu/cute.sh stage DEST   here (with an index): the pinned wheels of cute.lock.txt for the host
#                                    (cp312, x86_64) in DEST/part1 ... DEST/partN, each ≤ 40 MB, so that one
#                                    part and the working tree fit in one carried transfer of the device tool
#   bash ci/gpu/cute.sh install DIR  on the host, DIR holding every part's files: reassembles the split wheel,
#                                    installs into DIR/site-packages and prints the line to eval
# The folder must be named site-packages: QuACK fingerprints an epilogue's Python dependencies for its compile
# cache and treats only code under a site-packages folder as installed libraries (by version, not by source).
# Its PYTHONPATH names the DSL's own package folder too, which the wheel adds through a .pth file that Python
# reads from site directories only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
  stage)
    dest=${2:?usage: cute.sh stage DEST}
    rm -rf "$dest"; mkdir -p "$dest/wheels"
    grep -v '^#' "$here/cute.lock.txt" | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      -d "$dest/wheels" 2>&1 | grep -v '^WARNING: Location' || true
    cd "$dest/wheels"
    for f in *.whl; do [ "$(stat -c %s "$f")" -gt 40000000 ] && split -b 40000000 "$f" "$f.part_" && rm "$f"; done
    n=0; used=41000000
    for f in *; do  # greedy: a new part when this file would take the current one past 40 MB
      s=$(stat -c %s "$f")
      if [ $((used + s)) -gt 41000000 ]; then n=$((n + 1)); used=0; mkdir -p "../part$n"; fi
      mv "$f" "../part$n/"; used=$((used + s))
    done
    cd ..; rmdir wheels; du -sh part* ;;
  install)
    dir=$(cd "${2:?usage: cute.sh install DIR}" && pwd)
    cd "$dir"
    for first in *.part_aa; do
      [ -e "$first" ] || continue
      name=${first%.part_aa}; cat "$name".part_* > "$name"; rm -f "$name".part_*
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dir/site-packages" ./*.whl >&2
    echo "export PYTHONPATH=$dir/site-packages:$dir/site-packages/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}" ;;
  *) echo "usage: cute.sh stage DEST | install DIR" >&2; exit 2 ;;
esac
