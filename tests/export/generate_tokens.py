"""Driver: greedy fp32 generation with whatever vLLM this interpreter imports; writes the tokens and whether
Standard Kernels was importable. Imports nothing of ours (it runs where our package must not exist)."""
import argparse
import importlib.util
import json
from pathlib import Path

# Tasks of the project's trained models' corpus (sk.models.corpus), so their logits are peaked.
PROMPTS = ["add 478+95=", "rev kqzma=", "close ([{}(=", "rev standard="]
# The longest answer and its newline; past them the models' continuation was never trained.
MAX_TOKENS = 9


def generate(model: str, eager: bool) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model, dtype="float32", enforce_eager=eager, seed=0, max_model_len=512, kv_cache_memory_bytes=256 << 20)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outputs]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compiled", action="store_true", help="vLLM's default compile mode instead of eager")
    cli = parser.parse_args()
    import vllm

    result = {"tokens": generate(cli.model, eager=not cli.compiled), "vllm_file": vllm.__file__,
              "sk_importable": importlib.util.find_spec("sk") is not None}
    Path(cli.out).write_text(json.dumps(result))
