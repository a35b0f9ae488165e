#!/usr/bin/env bash
# The accuracy gate (sk.evals.gate) on the H200: vLLM 0.25.0, bf16, compile + CUDA graphs (vLLM's default),
# for the project's trained models (models/trained/{llama,gemma,qwen3}), stock kernels against ours; when SGLang is
# importable, the same rows in SGLang 0.5.17 too (through sk-serve, CUDA graphs on).
#
# Here (a machine with PyPI), once: stage lm-eval and what the host lacks, beside the engine wheels:
#   bash ../shared/gpu/stage-wheels.sh .gpu-stage vllm                  # vLLM 0.25.0 (see shared/gpu/README.md)
#   bash ci/gpu/accuracy_gate.sh stage .gpu-stage/lm-eval               # two more folders, each < 58 MB:
#                                                                       # .gpu-stage/lm-eval and lm-eval-pyarrow
# On the host, after `bash .gpu-flat/install.sh` (with both folders' files copied into .gpu-flat too)
# and its `export PYTHONPATH=...`:
#   bash ci/gpu/accuracy_gate.sh run OUTDIR [ENGINE [STYLE]]   # e.g. `sglang gemma`: that row alone
# (rows run side by side need the checkout installed first: ci/gpu/engines.sh install)
# OUTDIR gets gate.json, each run's lm-eval results and logs, environment.txt, and gate.log (both tables).
set -euo pipefail
cd "$(dirname "$0")/../.."

# lm-eval 0.4.13 and those of its dependencies that shared/gpu/host-packages.txt lacks (tenacity: its
# local-completions backend, which the SGLang rows use); pyarrow too, as
# datasets 5.2 needs pyarrow >= 24 (the host's is not pinned). The same pins as ci/envs/vllm_cpu.lock.txt.
WHEELS=(lm_eval==0.4.13 datasets==5.2.0 multiprocess==0.70.19 evaluate==0.4.6 more-itertools==11.2.1
        nltk==3.10.4 defusedxml==0.7.1 pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5
        chardet==6.0.0.post1 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 pytz==2026.6
        pyarrow==26.0.1 tenacity==9.1.4)
# Published as source only; pure Python, so a wheel built here installs on the host.
SOURCE_ONLY=(sqlitedict==2.1.0 word2number==1.1 rouge_score==0.1.2)

case "${1:-}" in
  stage)
    dest=${2:?usage: accuracy_gate.sh stage DEST}
    mkdir -p "$dest"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$dest" "${WHEELS[@]}"
    python3 -m pip wheel -q --no-deps -w "$dest" "${SOURCE_ONLY[@]}"
    # pyarrow alone is 55 MB: a folder of its own keeps each carried folder under the device tool's 64 MiB.
    mkdir -p "$dest-pyarrow" && mv "$dest"/pyarrow-*.whl "$dest-pyarrow"/
    du -sh "$dest" "$dest-pyarrow"
    ;;
  run)
    out=${2:?usage: accuracy_gate.sh run OUTDIR [ENGINE [STYLE]]}
    mkdir -p "$out"
    # Installed from this checkout already (ci/gpu/engines.sh install) or not: two gate rows started side by side
    # must not both run pip on the same checkout (the second failed, 2026-11-30).
    python3 -c 'import pathlib, sk; assert pathlib.Path(sk.__file__).resolve().is_relative_to(pathlib.Path.cwd())' \
      2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
      || { echo "installing the checkout failed"; exit 1; }
    export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer's sampler is not staged (shared/gpu/README.md)
    # SGLang's kernel build on the host is not the one it pins (ci/gpu/engines.sh); the gate gives SGLang
    # --sampling-backend pytorch itself.
    export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
    engines=(vllm)
    python3 -c 'import sglang' 2>/dev/null && engines+=(sglang)
    styles=(llama gemma qwen3)
    # One engine (and style) per call lets the rows run side by side, one GPU each.
    [ -n "${3:-}" ] && engines=("$3")
    [ -n "${4:-}" ] && styles=("$4")
    python3 - <<'EOF' | tee "$out/environment.txt"
import datetime, importlib.metadata as md, torch
print(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), torch.cuda.get_device_name(0))
installed = md.packages_distributions()
packages = [p for p in ("vllm", "sglang", "torch", "triton", "transformers", "lm_eval") if p in installed]
print(", ".join(f"{p} {md.version(p)}" for p in packages))
EOF
    # bf16 as served on GPUs; no KV cache size (the engines size it from free memory); compiled + CUDA graphs.
    # vLLM takes a share of GPU memory for everything, SGLang one for weights + KV cache.
    declare -A memory=([vllm]="gpu_memory_utilization: 0.3" [sglang]="mem_fraction_static: 0.3")
    echo "scenarios:" > "$out/scenario.yaml"
    for engine in "${engines[@]}"; do
      for style in "${styles[@]}"; do
        echo "  - {model: $PWD/models/trained/$style, engine: $engine, dtype: bfloat16, max_model_len: 256,
     engine_args: {${memory[$engine]}}, workloads: [LLM.single_request]}" >> "$out/scenario.yaml"
      done
    done
    python3 -m sk.evals.gate "$out/scenario.yaml" --out "$out" 2>&1 | tee "$out/gate.log"
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: accuracy_gate.sh stage DEST | run OUTDIR [ENGINE [STYLE]]" >&2
    exit 2
    ;;
esac
