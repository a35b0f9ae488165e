#!/usr/bin/env bash
# The engine checks on the GPU host, one or two steps per call of the device tool (a call runs ≤ 10 minutes):
#   bash ci/gpu/stage.sh .gpu-stage vllm        # here: wheels in folders that each fit one device-tool carry
#   bash ci/gpu/engines.sh install              # once per host, after the staged parts were copied into .gpu-flat
#   bash ci/gpu/engines.sh STEP OUTDIR          # one of the steps below
# Steps that use one GPU can run side by side on a 2-GPU host (CUDA_VISIBLE_DEVICES=0 / =1), each on its own
# half of the cores (taskset -c 0-15 / 16-31) so that one's compile work does not slow the other's timings.
#   vllm-llama, vllm-gemma  stock vLLM vs our adapter vs the exported patch series (ci/gpu/export_check.py)
#   vllm-trained            stock vLLM vs our adapter on the trained models (greedy tokens on peaked logits; six
#                           engine starts, ~11 min on the H200: in a chain give it SK_STEP_TIMEOUT=900)
#   vllm-trained-STYLE      one of them (llama, gemma, qwen3)
#   tp2, tp2-trained        stock vLLM vs our adapter at tensor_parallel_size=2 (ci/gpu/vllm_check.py), on the
#                           random Llama-style model / on the trained models (tp2-trained-llama, -gemma, -qwen3: one
#                           of them; four tp=2 engine starts can outlast one call)
#   sglang                  stock SGLang vs our adapter, and sk-serve --engine sglang (ci/gpu/sglang_check.py)
#   sglang-trained          stock SGLang vs our adapter on the trained models
#   sglang-export           stock SGLang vs our adapter vs the exported SGLang series (ci/gpu/export_check.py)
#   serve-vllm, serve-sglang  sk-serve's lifecycle: SIGTERM under long requests, SIGKILL (ci/gpu/serve_check.py)
#   reload, reload-vllm, reload-sglang  the engines' in-place weight updates with the fused blocks on, CUDA graphs
#                           on: after the update ours answers as an engine started on the new weights
#                           (ci/gpu/reload_check.py; three engine starts per engine)
#   gate                    the lm-eval accuracy gate on the trained models (ci/gpu/accuracy_gate.sh)
#   gate-ENGINE[-STYLE]     one engine's rows of it (gate-sglang-llama, gate-vllm, ...)
#   eval                    sk eval on scenarios/h200-llama.yaml, CUDA graphs on
#   selftest-MODEL-ENGINE   sk eval --self-test on h200-MODEL-ENGINE.yaml (in scenarios/): stock against stock
#   pair-MODEL-ENGINE       sk eval on it: stock against our adapter, paired (e.g. pair-llama3-8b-sglang)
#   bench-gated-mlp         benchmarks/bench_gated_mlp.py with the engines' kernels importable (vLLM's _C and
#                           sgl_kernel as peers), each sequence's kernels timed too (--kernels); three shapes at
#                           1-2048 rows unless SK_GATED_MLP_SHAPES ("all" or names) and SK_GATED_MLP_M say otherwise
#   bench-norm-pdl          benchmarks/bench_norm_pdl.py with the engines' norms importable: ours as dependent
#                           launches and in stream order, sgl_kernel's with and without its PDL, vLLM's _C, chained
#                           in CUDA graphs
#   profile-MODEL-ENGINE    sk profile on it, stock (SK_PROFILE_SK=1: with our adapter, --sk; SK_PROFILE_SK=both:
#                           stock then ours on this card and their comparison, --both; SK_PROFILE_SK=side-by-side:
#                           the same with both engines up at once as a pair runs them, --both --side-by-side):
#                           decode batch 1, 8, 64 and the 1024/128 throughput batch
#                           ($SK_EVAL_WORKLOADS, comma-separated, replaces the workloads of selftest-, pair- and
#                           profile-;
#                           SK_EVAL_CROSSED=1 adds --crossed: both start orders, the rounds pooled;
#                           SK_EVAL_RESTARTS=N adds --restarts N: N engine pairs, start orders alternating;
#                           SK_EVAL_ROUNDS=N adds --rounds N, all pairs' rounds together;
#                           SK_EVAL_MAX_LAYERS=N adds --max-layers N to pair- and profile-: the first N decoder
#                           layers, for a run that must fit little device time)
# selftest-, pair- and profile- steps also log the GPU's SM clock and power every 200 ms (nvidia-smi) into
# gpu_clocks.csv, to line up with the batches' start times in the JSON.
# A step writes everything into /tmp/sk-gpu/STEP and leaves in OUTDIR one archive of it, STEP.tgz (the device
# tool brings back at most 8 files a call).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu-flat/site
# flashinfer's sampler is not staged; the host is offline (no usage reports); vLLM processes are spawned, not
# forked (a process forked after torch's OpenMP work can hang); SGLang's kernel build is not the pinned one.
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
# NVLink multicast is off on these hosts (NCCL_NVLS_ENABLE=0 ...) and must not be asked for. At tp > 1 vLLM 0.25's
# all-reduce + RMSNorm fusion set up flashinfer's multicast (mnnvl) workspace and hung (2026-11-29); vllm_check.py
# turns that pass off. Should any other path still make a flashinfer all-reduce workspace, it is the CUDA-IPC
# (trtllm) one, never mnnvl.
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
step=${1:?usage: engines.sh install | STEP OUTDIR}

if [ "$step" = install ]; then
  bash .gpu-flat/install.sh >/dev/null || exit 1
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "installing the checkout failed"; exit 1; }
  # What was staged: vLLM and SGLang each with stage.sh, lm-eval (the gate steps) with accuracy_gate.sh stage.
  python3 - <<'PY'
import importlib, torch
for name in ("vllm", "sglang", "lm_eval"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:
        print(name, "not staged:", type(e).__name__)
print("torch", torch.__version__, "gpus", torch.cuda.device_count())
PY
  exit
fi

out=${2:?usage: engines.sh STEP OUTDIR}
work=/tmp/sk-gpu/$step
rm -rf "$work" && mkdir -p "$work" "$out"
case $step in
  vllm-llama|vllm-gemma) command=(python3 ci/gpu/export_check.py "$work" --styles "${step#vllm-}") ;;
  vllm-trained)   command=(python3 ci/gpu/vllm_check.py "$work" --styles llama-trained gemma-trained qwen3-trained) ;;
  vllm-trained-llama|vllm-trained-gemma|vllm-trained-qwen3)
          command=(python3 ci/gpu/vllm_check.py "$work" --styles "${step#vllm-trained-}-trained") ;;
  tp2)    command=(python3 ci/gpu/vllm_check.py "$work" --tp 2 --styles llama) ;;
  tp2-trained)    command=(python3 ci/gpu/vllm_check.py "$work" --tp 2 --styles llama-trained gemma-trained) ;;
  tp2-trained-llama|tp2-trained-gemma|tp2-trained-qwen3)
          command=(python3 ci/gpu/vllm_check.py "$work" --tp 2 --styles "${step#tp2-trained-}-trained") ;;
  sglang) command=(python3 ci/gpu/sglang_check.py "$work" --styles llama) ;;
  sglang-trained) command=(python3 ci/gpu/sglang_check.py "$work" --styles llama-trained gemma-trained qwen3-trained --no-serve) ;;
  sglang-export)  command=(python3 ci/gpu/export_check.py "$work" --engine sglang --styles llama) ;;
  serve-vllm|serve-sglang) command=(python3 ci/gpu/serve_check.py "${step#serve-}" "$work") ;;
  reload) command=(python3 ci/gpu/reload_check.py "$work") ;;
  reload-vllm|reload-sglang) command=(python3 ci/gpu/reload_check.py "$work" --engines "${step#reload-}") ;;
  gate)   command=(bash ci/gpu/accuracy_gate.sh run "$work") ;;
  gate-vllm|gate-sglang|gate-vllm-llama|gate-vllm-gemma|gate-vllm-qwen3|gate-sglang-llama|gate-sglang-gemma|\
  gate-sglang-qwen3)
          IFS=- read -r _ engine style <<< "$step"
          command=(bash ci/gpu/accuracy_gate.sh run "$work" "$engine" "$style") ;;
  eval)   command=(python3 -m sk.cli eval scenarios/h200-llama.yaml --max-requests 64 --out "$work") ;;
  selftest-*|pair-*)
          scenario=$PWD/scenarios/h200-${step#*-}.yaml
          command=(python3 -m sk.cli eval "$scenario" --out "$work"
                   ${SK_EVAL_WORKLOADS:+--workloads "$SK_EVAL_WORKLOADS"})
          [ "${step%%-*}" = selftest ] && command+=(--self-test)
          [ "${SK_EVAL_CROSSED:-0}" = 1 ] && command+=(--crossed)
          [ -n "${SK_EVAL_RESTARTS:-}" ] && command+=(--restarts "$SK_EVAL_RESTARTS")
          [ -n "${SK_EVAL_ROUNDS:-}" ] && command+=(--rounds "$SK_EVAL_ROUNDS")
          [ -n "${SK_EVAL_MAX_LAYERS:-}" ] && command+=(--max-layers "$SK_EVAL_MAX_LAYERS") ;;
  bench-gated-mlp)
          command=(python3 benchmarks/bench_gated_mlp.py --out "$work" --no-compile --kernels
                   --m "${SK_GATED_MLP_M:-1,8,32,128,2048}")
          [ "${SK_GATED_MLP_SHAPES:-}" = all ] \
            || command+=(--shapes "${SK_GATED_MLP_SHAPES:-llama3.2-1b,llama3-8b,gemma-2b}") ;;
  bench-norm-pdl) command=(python3 benchmarks/bench_norm_pdl.py "$work" --m "${SK_NORM_PDL_M:-1,8,32,128,1024}") ;;
  profile-*)
          workloads=LLM.decode_batch_1,LLM.decode_batch_8,LLM.decode_batch_64,LLM.throughput
          command=(python3 -m sk.cli profile "$PWD/scenarios/h200-${step#profile-}.yaml" --out "$work"
                   --workloads "${SK_EVAL_WORKLOADS:-$workloads}")
          case ${SK_PROFILE_SK:-0} in
            1) command+=(--sk) ;; both) command+=(--both) ;; side-by-side) command+=(--both --side-by-side) ;;
          esac
          [ -n "${SK_EVAL_MAX_LAYERS:-}" ] && command+=(--max-layers "$SK_EVAL_MAX_LAYERS") ;;
  *)      echo "unknown step $step" >&2; exit 2 ;;
esac
# Stopped in time for the archive to be written within the device tool's 10 minutes.
started=$SECONDS
sampler=
case $step in selftest-*|pair-*|profile-*)
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
      --format=csv -lms 200 > "$work/gpu_clocks.csv" 2>/dev/null & sampler=$!
  fi ;;
esac
timeout -k 15 "${SK_STEP_TIMEOUT:-540}" "${command[@]}" > "$work/$step.log" 2>&1
status=$?
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
echo "== $step: exit $status after $((SECONDS - started)) s" | tee -a "$work/$step.log"
cat "$work"/*.md 2>/dev/null || tail -n 40 "$work/$step.log"
tar czf "$out/$step.tgz" -C /tmp/sk-gpu "$step"
exit $status
