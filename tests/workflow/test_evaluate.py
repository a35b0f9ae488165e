"""The eval's comparison and tables, on engine results written here."""
import pytest
from rich.console import Console

from sk.workflow import evaluate
from sk.workflow.errors import WorkflowError
from sk.workflow.scenarios import Scenario


def greedy(tokens):
    return {"tokens": tokens, "input_lens": [5] * len(tokens)}


def timings(baseline_s, candidate_s, output_tokens=4):
    return {"baseline": [{"elapsed_s": t, "output_tokens": output_tokens} for t in baseline_s],
            "candidate": [{"elapsed_s": t, "output_tokens": output_tokens} for t in candidate_s]}


def test_first_divergence_names_sequence_position_and_tokens():
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) is None
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 7, 6]]) == {
        "sequence": 1, "position": 1, "baseline_token": 5, "candidate_token": 7}
    assert evaluate.first_divergence([[1, 2]], [[1, 2, 3]])["position"] == 2


def test_rows_count_matches_and_pair_the_rounds():
    row = evaluate.compare_workload("LLM.mixed", greedy([[1, 2], [3, 4]]), greedy([[1, 2], [3, 5]]),
                                    timings([1.0, 1.0, 1.0], [0.8, 0.8, 0.8]))
    assert (row["matches"], row["sequences"], row["rounds"]) == (1, 2, 3)
    assert row["speedup"] == 1.25 and row["verdict"] == "candidate faster"
    assert (row["baseline_tok_s"], row["candidate_tok_s"]) == (4.0, 5.0)
    assert row["divergence"] == {"sequence": 1, "position": 1, "baseline_token": 4, "candidate_token": 5}
    row = evaluate.compare_workload("LLM.single_request", greedy([[1, 2, 3]]), greedy([[1, 2, 3]]),
                                    timings([0.5, 0.52, 0.49, 0.51], [0.51, 0.5, 0.5, 0.5]))
    assert (row["matches"], row["batch_size"], row["verdict"]) == (1, 1, "within noise")


def test_summary_tables_show_the_seed_columns_intervals_and_the_verdict():
    scenario = Scenario(model="sk-tiny/llama", dtype="float32", workloads=["LLM.mixed", "LLM.single_request"])
    rows = [evaluate.compare_workload("LLM.mixed", greedy([[1, 2], [3, 4]]), greedy([[1, 2], [3, 5]]),
                                      timings([0.9, 0.9], [1.0, 1.0])),
            evaluate.compare_workload("LLM.single_request", greedy([[1, 2, 3]]), greedy([[1, 2, 3]]),
                                      timings([0.5, 0.5], [0.4, 0.4]))]
    result = {"scenario": scenario.model_dump(), "rows": rows, "correctness": "FAIL",
              "adapter": {"workers": 1, "replaced": ["SiluAndMul"], "kernel_calls": {}, "fallbacks": {}},
              "candidates_replaced": None, "self_test": False,
              "environment": {"vllm": "0.32.0", "torch": "2.13", "device": "cpu"},
              "settings": {"enforce_eager": True, "order": "ABBA"}}
    console = Console(width=250, record=True)
    evaluate.print_scenario(console, result)
    text = console.export_text()
    for expected in ("THROUGHPUT SUMMARY", "correctness: FAIL", "BASELINE tok/s", "MATCH", "1/2", "0.90x",
                     "95% CI", "[0.90, 0.90]", "candidate slower", "LATENCY SUMMARY", "BASELINE med", "0.5000s",
                     "1.25x", "candidate faster", "mixed: first divergence at sequence 1, output position 1",
                     "paired A/B, order ABBA", "CPU timings"):
        assert expected in text, expected


def test_a_self_test_with_a_candidate_folder_is_refused(tmp_path):
    with pytest.raises(WorkflowError, match="--self-test runs the stock engine against itself and takes no "
                                            "candidate folder; got --candidates"):
        evaluate.check_self_test(True, tmp_path)
    evaluate.check_self_test(True, None)
