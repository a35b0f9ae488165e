#!/usr/bin/env bash
# Stage the engines' wheels for the GPU host in folders that each fit one `carry` of the device tool beside the
# working tree (64 MiB in all, the tree included): ../shared/gpu/stage-wheels.sh makes 58 MB folders, too big
# with the tree, so its wheels are rejoined and re-packed here into folders of at most PART_MB MB. The default
# leaves 8 MB for the tree to grow: 64 MiB less the tree's files now (tracked and untracked, not ignored), less
# 8 MB (the 42 MB parts of 2026-12-05 fitted the 25.8 MB tree by 0.1 MB).
#
#   bash ci/gpu/stage.sh DEST vllm [sglang ...] [FOLDER ...]   # DEST/part1 ... DEST/partN; install.sh in part1
#
# A FOLDER argument adds its wheels (e.g. the accuracy gate's, `ci/gpu/accuracy_gate.sh stage FOLDER`, and its
# FOLDER-pyarrow); the host's install.sh installs every staged wheel.
# On the host, one call per part (carry DEST/partK, copy its files into .gpu-flat), then
#   bash ci/gpu/engines.sh install                   # reassembles, installs into .gpu-flat/site
set -euo pipefail
dest=${1:?usage: stage.sh DEST vllm|sglang|NAME==VER|FOLDER ...}; shift
here=$(cd "$(dirname "$0")/../.." && pwd)
tree=$(git -C "$here" ls-files -z --cached --others --exclude-standard \
       | (cd "$here" && xargs -0 stat -c %s 2>/dev/null; true) | awk '{s += $1} END {print s + 0}')  # slimmed: gone
part_mb=${PART_MB:-$(( (64 * 1024 * 1024 - tree) / 1000000 - 8 ))}
[ "$part_mb" -ge 16 ] || { echo "stage.sh: parts of $part_mb MB: the tree ($tree bytes) leaves too little" >&2; exit 1; }
wanted=(); folders=()
for a in "$@"; do if [ -d "$a" ]; then folders+=("$a"); else wanted+=("$a"); fi; done
raw=$(mktemp -d); flat=$(mktemp -d)
bash "$here/../shared/gpu/stage-wheels.sh" "$raw" "${wanted[@]}" >/dev/null
for d in "$raw"/part* "${folders[@]}"; do cp "$d"/* "$flat/"; done
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
echo "parts of at most $part_mb MB beside a tree of $tree bytes"
