#!/usr/bin/env bash
# QuACK (CuTe DSL) for the GPU host, which has no package index:
#   bash ci/gpu/cute.sh stage DEST   here (with an index): the pinned wheels of cute.lock.txt for the host
#                                    (cp312, x86_64) in DEST/part1 ... DEST/partN of at most 41 MB each, so that
#                                    one part and the working tree fit in one carried transfer of the device tool
#   bash ci/gpu/cute.sh install DIR  on the host, DIR holding every part's files (flat, or in its part*/
#                                    folders): reassembles the split wheel, installs into DIR/site-packages and
#                                    prints the line to eval
# The folder must be named site-packages: QuACK fingerprints an epilogue's Python dependencies for its compile
# cache and treats only code under a site-packages folder as installed libraries (by version, not by source);
# elsewhere it walks into the CuTe DSL's own globals and rejects one (a TypeError at import).
# Its PYTHONPATH names the DSL's own package folder too, which the wheel adds through a .pth file that Python
# reads from site directories only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
limit=41000000  # bytes a part may hold
case ${1:-} in
  stage)
    dest=${2:?usage: cute.sh stage DEST}
    rm -rf "$dest"/part* "$dest/wheels"; mkdir -p "$dest/wheels"
    grep -v '^#' "$here/cute.lock.txt" | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      -d "$dest/wheels" 2> >(grep -v '^WARNING: Location' >&2)
    cd "$dest/wheels"
    for f in *.whl; do
      if [ "$(stat -c %s "$f")" -gt $limit ]; then split -b $limit "$f" "$f.part_"; rm "$f"; fi
    done
    n=0; used=$limit
    for f in *; do  # greedy: a new part when this file would take the current one past the limit
      s=$(stat -c %s "$f")
      if [ $((used + s)) -gt $limit ]; then n=$((n + 1)); used=0; mkdir -p "../part$n"; fi
      mv "$f" "../part$n/"; used=$((used + s))
    done
    cd ..; rmdir wheels; du -sh part* ;;
  install)
    dir=$(cd "${2:?usage: cute.sh install DIR}" && pwd)
    cd "$dir"
    for part in part*/; do [ -d "$part" ] && mv "$part"* . && rmdir "$part"; done
    for first in *.part_aa; do
      [ -e "$first" ] || continue
      name=${first%.part_aa}; cat "$name".part_* > "$name"; rm -f "$name".part_*
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dir/site-packages" ./*.whl >&2
    site=$dir/site-packages
    printf 'export PYTHONPATH=%q:%q${PYTHONPATH:+:$PYTHONPATH}\n' "$site" "$site/nvidia_cutlass_dsl/dsl_packages" ;;
  *) echo "usage: cute.sh stage DEST | install DIR" >&2; exit 2 ;;
esac
