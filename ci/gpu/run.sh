#!/usr/bin/env bash
# The GPU suite in one command, on any CUDA machine with torch and triton:
#   ci/gpu/run.sh OUTDIR
# installs this checkout (no dependencies fetched), runs the op/module test suite (GPU-marked tests included;
# the engine tests under tests/*/ need the CPU venvs and have GPU scripts of their own in ci/gpu/),
# then the ops benchmark against PyTorch and the importable peers, writing logs, JSON, Markdown and a plot
# into OUTDIR. With QuACK's staged parts (ci/gpu/cute.sh) in $SK_CUTE_DIR (default .cute-flat),
# fused_pre_norm_geglu runs its CuTe-DSL GEMMs.
# Set SK_GPU_STEPS to a subset of "tests tune bench geglu training" to run less (or, for "training", more:
# the training-ops benchmark with its launch sweep and the sk.nn.swap training run, not in the default set;
# "training-tests": the training kernels' test files alone; "training-bench": the training-ops benchmark alone,
# every size, torch.compile included; "training-bench-peers": the same without torch.compile (Liger, QuACK);
# "linear": sk.ops.linear against cuBLAS at the attention projections, and
# its tests and the fused blocks' GPU tests; "linear-sweep": its split-K configs swept at Llama-3-8B's and
# Llama-3.2-1B's projections (or SK_LINEAR_SHAPES at SK_LINEAR_M rows); "qk-norm": Qwen3's q/k norms + rotary
# compiled, vLLM's math against ours inside;
# "decoder-chain": decoder layers without attention under Inductor, our norm/activation kernels inside or not
# (SK_CHAIN_SHAPE, default qwen3-8b, at SK_CHAIN_M rows, default 1,8,32); "norm-pdl": our RMSNorm as dependent
# launches against plain stream order, chained in graphs (with the engines installed, ci/gpu/engines.sh
# bench-norm-pdl adds their norms);
# "host-path": the host's µs per call of each of our ops on the GPU, as an engine's eager step calls them;
# "geglu-paths": the GEGLU op on the paths a user takes, seed/decode/prefill shapes,
# inference only; "gated-mlp": benchmarks/bench_gated_mlp.py at the engines' shapes with the peers importable here,
# each implementation's kernels timed too (with the engines installed, ci/gpu/engines.sh bench-gated-mlp adds
# vLLM's and SGLang's sequences); three shapes at 1-2048 rows unless SK_GATED_MLP_SHAPES ("all" or names) and
# SK_GATED_MLP_M say otherwise; "gated-mlp-sweep": the same cases' candidate GEMM configs timed instead (what
# the op's config table is chosen from); "gated-mlp-tests": the op's, its module's and sk.ops.linear's tests).
set -uo pipefail
out=${1:?usage: ci/gpu/run.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
steps=${SK_GPU_STEPS:-tests bench geglu}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "installing the checkout failed"; exit 1; }
if [ -d .whl ]; then  # optional peer wheels carried along (e.g. liger-kernel)
  python3 -m pip install -q --no-index --no-deps --target /tmp/sk-peers .whl/*.whl >/dev/null 2>&1 \
    && export PYTHONPATH=/tmp/sk-peers${PYTHONPATH:+:$PYTHONPATH}
fi
cute_dir=${SK_CUTE_DIR:-.cute-flat}
if [ -d "$cute_dir" ]; then  # QuACK's CuTe-DSL GEMMs, staged by ci/gpu/cute.sh (else the Triton GEMMs run)
  cute_env=$(bash ci/gpu/cute.sh install "$cute_dir") || { echo "installing QuACK failed"; exit 1; }
  eval "$cute_env"
fi
python3 -c 'import torch, triton; p = torch.cuda.get_device_properties(0); print(p.name, torch.__version__, triton.__version__)' \
  | tee "$out/environment.txt"
# The gated-MLP benchmark's cases: SK_GATED_MLP_SHAPES (comma-separated names, or "all") and SK_GATED_MLP_M.
gated_mlp_cases=(--m "${SK_GATED_MLP_M:-1,8,32,128,2048}")
[ "${SK_GATED_MLP_SHAPES:-}" = all ] \
  || gated_mlp_cases+=(--shapes "${SK_GATED_MLP_SHAPES:-llama3.2-1b,llama3-8b,gemma-2b}")
status=0
for step in $steps; do
  case $step in
    tests) python3 -m pytest -q -p no:cacheprovider tests/test_*.py 2>&1 | tee "$out/tests.log"
           status=$((status | ${PIPESTATUS[0]})) ;;
    tune)  python3 benchmarks/tune_launch.py "$out" 2>&1 | tee "$out/tune.log" ;;
    bench) sk bench --peers --out "$out" 2>&1 | tee "$out/bench.log" ;;
    geglu) [ -f benchmarks/bench_geglu.py ] && python3 benchmarks/bench_geglu.py "$out" 2>&1 | tee "$out/geglu.log" ;;
    gated-mlp) python3 benchmarks/bench_gated_mlp.py --out "$out/gated_mlp" --no-compile --kernels \
                 "${gated_mlp_cases[@]}" 2>&1 | tee "$out/gated_mlp.log" ;;
    gated-mlp-sweep) python3 benchmarks/bench_gated_mlp.py --sweep --out "$out/gated_mlp" "${gated_mlp_cases[@]}" \
                       2>&1 | tee "$out/gated_mlp_sweep.log" ;;
    gated-mlp-tests) python3 -m pytest -q -p no:cacheprovider -rf tests/test_fused_gated_mlp.py \
                       tests/test_nn_norm_mlp.py tests/test_linear.py 2>&1 | tee "$out/gated_mlp_tests.log"
                     status=$((status | ${PIPESTATUS[0]})) ;;
    geglu-paths) python3 benchmarks/bench_geglu_paths.py "$out/geglu_paths" --no-training 2>&1 \
                   | tee "$out/geglu_paths.log" ;;
    training) python3 benchmarks/bench_training_ops.py --sweep --out "$out/training" 2>&1 | tee "$out/training.log"
              python3 benchmarks/train_swap.py --out "$out/training" 2>&1 | tee "$out/train_swap.log" ;;
    training-tests) python3 -m pytest -q -p no:cacheprovider -rf tests/test_rms_norm.py tests/test_act_and_mul.py \
                      tests/test_nn_swap.py tests/test_autograd_audit.py 2>&1 | tee "$out/training_tests.log"
                    status=$((status | ${PIPESTATUS[0]})) ;;
    training-bench) python3 benchmarks/bench_training_ops.py --out "$out/training" 2>&1 | tee "$out/training.log" ;;
    training-bench-peers) python3 benchmarks/bench_training_ops.py --no-compile --out "$out/training" 2>&1 \
                            | tee "$out/training.log" ;;
    linear) python3 benchmarks/bench_linear.py --out "$out/linear" 2>&1 | tee "$out/linear.log"
            python3 -m pytest -q -p no:cacheprovider -rf tests/test_linear.py 2>&1 | tee "$out/linear_tests.log"
            status=$((status | ${PIPESTATUS[0]}))
            python3 -m pytest -q -p no:cacheprovider -rf -k gpu tests/adapters/test_fused_blocks.py 2>&1 \
              | tee "$out/fused_blocks_gpu_tests.log"
            status=$((status | ${PIPESTATUS[0]})) ;;
    host-path) python3 benchmarks/op_host_path.py --out "$out/host_path" 2>&1 | tee "$out/host_path.log" ;;
    qk-norm) python3 benchmarks/bench_qk_norm.py "$out/qk_norm" 2>&1 | tee "$out/qk_norm.log" ;;
    norm-pdl) python3 benchmarks/bench_norm_pdl.py "$out/norm_pdl" 2>&1 | tee "$out/norm_pdl.log" ;;
    decoder-chain) python3 benchmarks/bench_decoder_chain.py "$out/decoder_chain" --shape "${SK_CHAIN_SHAPE:-qwen3-8b}" \
                     --m "${SK_CHAIN_M:-1,8,32}" 2>&1 | tee "$out/decoder_chain.log" ;;
    linear-sweep) python3 benchmarks/bench_linear.py --sweep \
                    --shapes "${SK_LINEAR_SHAPES:-llama3-8b-qkv,llama3-8b-o,llama3.2-1b-qkv}" \
                    --m "${SK_LINEAR_M:-1,8,32}" --out "$out/linear" 2>&1 | tee "$out/linear_sweep.log" ;;
  esac
done
exit $status
