#!/usr/bin/env bash
# Stage the engines' wheels for the GPU host in folders that each fit one `carry` of the device tool beside the
# working tree (64 MiB in all): ../shared/gpu/stage-wheels.sh makes 58 MB folders, too big with the tree, so its
# wheels are rejoined and re-packed here into folders of at most PART_MB (default 46) MB.
#
#   bash ci/gpu/stage.sh DEST vllm [sglang ...]       # DEST/part1 ... DEST/partN; install.sh in part1
#
# On the host, one call per part (carry DEST/partK, copy its files into .gpu-flat), then
#   bash ci/gpu/engines.sh install                   # reassembles, installs into .gpu-flat/site
set -euo pipefail
dest=${1:?usage: stage.sh DEST vllm|sglang|NAME==VER ...}; shift
part_mb=${PART_MB:-46}
here=$(cd "$(dirname "$0")/../.." && pwd)
raw=$(mktemp -d); flat=$(mktemp -d)
bash "$here/../shared/gpu/stage-wheels.sh" "$raw" "$@" >/dev/null
for d in "$raw"/part*; do cp "$d"/* "$flat/"; done
for first in "$flat"/*.part_aa; do  # rejoin what stage-wheels split, to split it again at our size
  [ -e "$first" ] || continue
  name=${first%.part_aa}; cat "$name".part_* > "$name"; rm -f "$name".part_*
done
limit=$((part_mb * 1000 * 1000)); piece=$((part_mb - 2))
rm -rf "$dest"; mkdir -p "$dest/part1"; n=1; used=0
put() {
  local s; s=$(stat -c %s "$1")
  if [ $((used + s)) -gt $limit ]; then n=$((n + 1)); used=0; mkdir -p "$dest/part$n"; fi
  cp "$1" "$dest/part$n/"; used=$((used + s))
}
put "$flat/install.sh"
pieces=$(mktemp -d)
for f in "$flat"/*.whl; do
  if [ "$(stat -c %s "$f")" -gt $((piece * 1000 * 1000)) ]; then
    split -b "${piece}MB" "$f" "$pieces/$(basename "$f").part_"  # install.sh rejoins NAME.part_*
  else
    put "$f"
  fi
done
for f in "$pieces"/*; do [ -e "$f" ] && put "$f"; done
rm -rf "$raw" "$flat" "$pieces"
du -sh "$dest"/part* | sed 's#'"$dest"'/##'
