#!/usr/bin/env bash
# One device session's GPU work as a chain that runs in the background on the host, so that the device tool's
# calls (staging, then polls) follow each other without a gap: the host goes back 30 s after a call returns, and
# the next call then starts a bare one (results/h200/engines/README.md, 2026-12-03 and 2026-12-04).
#
#   bash ci/gpu/chain.sh start PLAN [PART]   first call: copies the tree to $SK_CHAIN_DIR/tree, the staged engine
#                                            part PART (a folder carried with this call) into the wheel folder,
#                                            starts the chain on PLAN (a file, carried or tracked), returns
#   bash ci/gpu/chain.sh part PART [--last]  one call per further part; --last with the last one
#   bash ci/gpu/chain.sh plan 'LINE' ...     replaces the steps not yet begun
#   bash ci/gpu/chain.sh tree                the steps not yet begun run this call's checkout (a fix made while
#                                            the chain runs, measured by a later step of the same session)
#   bash ci/gpu/chain.sh poll WAIT PATTERN   waits up to WAIT s for PATTERN in the progress, copies the finished
#                                            steps' archives into $OUT; exit 3 at once on a bare host (the chain
#                                            is gone: do not wait)
#   bash ci/gpu/chain.sh slim | unslim       on THIS machine, before the first call / after the last: removes
#                                            from the working tree the tracked result files no GPU step reads
#                                            (traces, archives, PNGs under results/), so that the tree and one
#                                            staged part fit a call's 64 MiB; unslim restores them from git
#
# PLAN: one step a line, "VAR=value ... STEP". STEP is `gpu:STEP` (a step of ci/gpu/run.sh, which needs no
# engine: tests, training-tests, training-bench, bench, ...) or a step of ci/gpu/engines.sh (the engines are
# installed before the first such step, once the last part is in). Steps run one after the other, each alone on
# the GPU; step N leaves $SK_CHAIN_DIR/res/N-STEP.tgz. With no engine step, start needs no PART and no --last.
set -uo pipefail
W=${SK_CHAIN_DIR:-/tmp/sk-chain}
log() { echo "$(date -u +%T) $*" >> "$W/progress"; }
# What `slim` takes out of the working tree (tracked files under results/ that no GPU step reads).
SLIM='(trace\.json\.gz|\.tgz|\.png)$'

run_chain() {
  cd "$W/tree" || exit 1
  log "chain start"
  local i=0 line words step status
  while true; do
    line=$(grep -v '^\s*\(#\|$\)' "$W/plan" | head -n 1); [ -n "$line" ] || break
    awk '!taken && $0 !~ /^[[:space:]]*(#|$)/ {taken = 1; next} 1' "$W/plan" > "$W/plan.next"
    mv "$W/plan.next" "$W/plan"
    i=$((i + 1)); read -ra words <<< "$line"; step=${words[-1]}; unset 'words[-1]'
    if [ -d "$W/tree.next" ]; then  # `chain.sh tree`: swapped between steps, never under a running one
      cd "$W" && rm -rf "$W/tree" && mv "$W/tree.next" "$W/tree" && cd "$W/tree" || exit 1
      ln -sfn "$W/flat" .gpu-flat
      [ -f "$W/engines-installed" ] && { python3 -m pip install -q --no-deps --no-build-isolation -e . \
        >/dev/null 2>&1 || log "reinstalling the new tree failed"; }
      log "tree replaced by $(cat .chain-tree)"
    fi
    log "begin $i $line"
    rm -rf "$W/out$i"; mkdir -p "$W/out$i"
    case $step in
      gpu:*)
        env "${words[@]}" SK_GPU_STEPS="${step#gpu:}" bash ci/gpu/run.sh "$W/out$i/${step#gpu:}" \
          > "$W/out$i/step.log" 2>&1
        status=$?
        tar czf "$W/res/$i-${step#gpu:}.tgz" -C "$W/out$i" . ;;
      *)
        if [ ! -f "$W/engines-installed" ]; then
          while [ ! -f "$W/parts-done" ]; do sleep 2; done
          ln -sfn "$W/flat" .gpu-flat
          bash ci/gpu/engines.sh install > "$W/res/install.log" 2>&1 || { log "engine install failed"; break; }
          touch "$W/engines-installed"; log "engines installed"
        fi
        env "${words[@]}" bash ci/gpu/engines.sh "$step" "$W/out$i" > "$W/out$i/step.log" 2>&1
        status=$?
        [ -f "$W/out$i/$step.tgz" ] && mv "$W/out$i/$step.tgz" "$W/res/$i-$step.tgz"
        cp "$W/out$i/step.log" "$W/res/$i-$step.log" ;;
    esac
    log "end $i $step exit $status"
  done
  log "chain end"
}

copy_part() {
  [ -d "${1:-}" ] || { echo "chain.sh: no staged part folder '${1:-}' here (carry it with this call)" >&2; exit 2; }
  cp "$1"/* "$W/flat/"
}

case ${1:-} in
  start)
    plan=${2:?usage: chain.sh start PLAN [PART]}
    [ -f "$plan" ] || { echo "chain.sh: no plan file '$plan' here" >&2; exit 2; }
    [ -f "$W/progress" ] && ! grep -q "chain end" "$W/progress" && { echo "chain.sh: a chain runs already" >&2; exit 2; }
    rm -rf "$W"; mkdir -p "$W/tree" "$W/res" "$W/flat"
    cp "$plan" "$W/plan"
    [ -n "${3:-}" ] && copy_part "$3"
    # The tree without the staged parts: the device tool re-copies the checkout at every call, under the chain.
    tar --exclude=./.gpu-stage --exclude=./.gpu-flat -cf - . | tar -C "$W/tree" -xf -
    grep -qv '^\s*\(#\|$\)\|gpu:' "$W/plan" || touch "$W/parts-done"
    setsid nohup bash "$0" _run > "$W/chain.out" 2>&1 < /dev/null &
    sleep 1; cat "$W/progress" ;;
  _run) run_chain ;;
  part)
    [ -d "$W/flat" ] || { echo "BARE HOST"; exit 3; }
    copy_part "${2:-}"
    [ "${3:-}" = --last ] && touch "$W/parts-done"
    echo "$(ls "$W/flat" | wc -l) files staged"; tail -n 2 "$W/progress" ;;
  tree)
    [ -f "$W/progress" ] || { echo "BARE HOST"; exit 3; }
    rm -rf "$W/tree.next"; mkdir -p "$W/tree.next"
    tar --exclude="./.gpu-stage*" --exclude=./.gpu-flat --exclude=./build -cf - . | tar -C "$W/tree.next" -xf -
    date -u +%T > "$W/tree.next/.chain-tree"
    echo "the next step to begin runs this checkout ($(cat "$W/tree.next/.chain-tree"))"; tail -n 2 "$W/progress" ;;
  plan)
    [ -f "$W/progress" ] || { echo "BARE HOST"; exit 3; }
    shift; printf '%s\n' "$@" > "$W/plan"; cat "$W/plan" ;;
  poll)
    [ -f "$W/progress" ] || { echo "BARE HOST"; exit 3; }
    wait_s=${2:?usage: chain.sh poll WAIT PATTERN}; pattern=${3:?usage: chain.sh poll WAIT PATTERN}
    end=$((SECONDS + wait_s))
    while [ $SECONDS -lt $end ] && ! grep -q -- "$pattern" "$W/progress" && ! grep -q "chain end" "$W/progress"; do
      sleep 3
    done
    cat "$W/progress"; echo "-- not begun:"; cat "$W/plan"
    [ -n "${OUT:-}" ] && for f in "$W"/res/*; do [ -f "$f" ] && cp "$f" "$OUT/"; done
    exit 0 ;;
  slim)
    cd "$(dirname "$0")/../.." && git ls-files -z results | { grep -zE "$SLIM" || true; } | xargs -0 -r rm -f
    echo "results' traces, archives and PNGs removed from the working tree until 'chain.sh unslim'" ;;
  unslim)  # only what slim removed: edits to other files under results/ stay
    cd "$(dirname "$0")/../.." \
      && git ls-files -z --deleted results | { grep -zE "$SLIM" || true; } | xargs -0 -r git checkout -- \
      && echo "$(git ls-files --deleted results | grep -cE "$SLIM") files still missing under results/" ;;
  *) sed -n '2,26p' "$0"; exit 2 ;;
esac
