"""The eval's comparison and tables, on engine results written here."""
from rich.console import Console

from sk.workflow import evaluate
from sk.workflow.scenarios import Scenario


def throughput(tokens, tok_s):
    return {"purpose": "throughput", "tokens": tokens, "input_lens": [5, 9], "output_lens": [len(t) for t in tokens],
            "output_tokens_per_s": tok_s}


def latency(tokens, median):
    return {"purpose": "latency", "tokens": tokens, "batch_size": len(tokens), "output_len": 3, "iterations": 5,
            "median_s": median}


def test_first_divergence_names_sequence_position_and_tokens():
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) is None
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 7, 6]]) == {
        "sequence": 1, "position": 1, "baseline_token": 5, "candidate_token": 7}
    assert evaluate.first_divergence([[1, 2]], [[1, 2, 3]])["position"] == 2


def test_rows_count_matches_and_speedups():
    row = evaluate.compare_workload("LLM.mixed", throughput([[1, 2], [3, 4]], 100.0),
                                    throughput([[1, 2], [3, 5]], 125.0))
    assert (row["matches"], row["sequences"], row["speedup"]) == (1, 2, 1.25)
    assert row["divergence"] == {"sequence": 1, "position": 1, "baseline_token": 4, "candidate_token": 5}
    row = evaluate.compare_workload("LLM.single_request", latency([[1, 2, 3]], 0.5), latency([[1, 2, 3]], 0.4))
    assert (row["matches"], row["speedup"]) == (1, 1.25)


def test_summary_tables_show_the_seed_columns_and_the_verdict():
    scenario = Scenario(model="sk-tiny/llama", dtype="float32", workloads=["LLM.mixed", "LLM.single_request"])
    rows = [evaluate.compare_workload("LLM.mixed", throughput([[1, 2], [3, 4]], 100.0),
                                      throughput([[1, 2], [3, 5]], 90.0)),
            evaluate.compare_workload("LLM.single_request", latency([[1, 2, 3]], 0.5), latency([[1, 2, 3]], 0.4))]
    result = {"scenario": scenario.model_dump(), "rows": rows, "correctness": "FAIL",
              "adapter": {"workers": 1, "replaced": ["SiluAndMul"], "kernel_calls": {}, "fallbacks": {}},
              "candidates_replaced": None,
              "environment": {"vllm": "0.32.0", "torch": "2.13", "device": "cpu"}, "settings": {"enforce_eager": True}}
    console = Console(width=200, record=True)
    evaluate.print_scenario(console, result)
    text = console.export_text()
    for expected in ("THROUGHPUT SUMMARY", "correctness: FAIL", "BASELINE tok/s", "MATCH", "1/2", "0.90x",
                     "LATENCY SUMMARY", "BASELINE med", "0.5000s", "1.25x",
                     "mixed: first divergence at sequence 1, output position 1"):
        assert expected in text, expected
