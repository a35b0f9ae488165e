"""The engines' GPU checks (ci/gpu/vllm_check.py, shared by sglang_check.py) score greedy tokens against stock:
whole sequences, and on the trained models the answers, up to the newline that ends them."""
import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[2] / "ci" / "gpu"
sys.path.insert(0, str(CHECKS))
import vllm_check  # noqa: E402


def run(tokens):
    # top-k lists: the token itself and four fixed others, so overlap is 1 where the tokens agree
    return {"tokens": tokens, "topk": [[[t, 900, 901, 902, 903] for t in seq] for seq in tokens]}


def test_answers_compare_up_to_the_newline():
    nl = 201  # the trained tokenizers' newline (next test)
    stock = run([[5, 6, nl, 7, 8], [5, 6, nl, 7, 8], [5, 9, nl, 7, 8], [5, 6, 6, 6, 6], [5, nl, 6, 7, 8],
                 [5, 6, nl, 7, 8]])
    ours = run([[5, 6, nl, 7, 8], [5, 6, nl, 3, 3], [5, 6, nl, 7, 8], [5, 6, 6, 6, 4], [5, 6, nl, 7, 8],
                [5, 6, 7, 7, 8]])
    agree = vllm_check.agreement(stock, ours, nl)
    # equal; differs past the answer; differs inside it; no newline: the whole sequence is the answer;
    # the answer ends at different steps; only one side ends its answer
    assert agree["exact_sequences"] == 1
    assert agree["first_divergence"] == [None, 3, 1, 4, 1, 2]
    assert agree["answers_equal"] == 2
    assert "1/6; answers 2/6" in vllm_check.greedy_cells(agree)
    assert "answers_equal" not in vllm_check.agreement(stock, ours)  # random models: no answers to compare


def test_answer_end_is_the_trained_tokenizers_newline(vllm_python):
    # tokenizers comes with the engines: run in the vLLM CPU venv
    script = """
import vllm_check
from tokenizers import Tokenizer
for style in ("llama-trained", "gemma-trained", "qwen3-trained"):
    tokenizer = Tokenizer.from_file(str(vllm_check.TRAINED_MODELS[style] / "tokenizer.json"))
    end = vllm_check.answer_end_id(style)
    print(style, end, repr(tokenizer.decode([end])))
print("llama", vllm_check.answer_end_id("llama"))
"""
    done = subprocess.run([vllm_python, "-c", script], cwd=CHECKS, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["llama-trained 201 '\\n'", "gemma-trained 201 '\\n'", "qwen3-trained 201 '\\n'",
                                     "llama None"]
