"""The eval's comparison and tables, on engine results written here."""
import json
from pathlib import Path

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


def printed(rows, correctness, self_test=False, replaced=(), kv_cache_tokens=None, **adapter):
    """What `sk eval` prints for one scenario of these rows (an adapter run on the CPU engine)."""
    scenario = Scenario(model="sk-tiny/llama", dtype="float32", workloads=[r["workload"] for r in rows])
    result = {"scenario": scenario.model_dump(), "rows": rows, "correctness": correctness,
              "adapter": {"workers": 1, "replaced": list(replaced), "kernel_calls": {}, "fallbacks": {}, **adapter},
              "candidates_replaced": None, "self_test": self_test, "kv_cache_tokens": kv_cache_tokens,
              "environment": {"vllm": "0.32.0", "torch": "2.13", "device": "cpu"},
              "settings": {"enforce_eager": True, "order": "ABBA"}}
    console = Console(width=250, record=True)
    evaluate.print_scenario(console, result)
    return console.export_text()


def test_first_divergence_names_sequence_position_and_tokens():
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) is None
    assert evaluate.first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 7, 6]]) == {
        "sequence": 1, "position": 1, "baseline_token": 5, "candidate_token": 7}
    assert evaluate.first_divergence([[1, 2]], [[1, 2, 3]])["position"] == 2


def test_a_divergence_at_a_near_tie_is_told_from_a_mismatch():
    # Per sequence, per position, the engine's top [token, logprob] pairs. Sequence 0: both engines rank 4 and 5
    # within 0.05 nats (a near-tie); sequence 1: the baseline prefers 7 by 2 nats (a mismatch); sequence 2: the
    # candidate's token is outside the baseline's top ones (a mismatch); sequence 3 agrees.
    base = {"tokens": [[1, 4], [2, 7], [3, 9], [6, 6]], "top_logprobs": [
        [[[1, -0.1]], [[4, -0.70], [5, -0.75]]], [[[2, -0.1]], [[7, -0.1], [8, -2.1]]],
        [[[3, -0.1]], [[9, -0.2], [1, -3.0]]], [[[6, -0.1]], [[6, -0.1]]]]}
    cand = {"tokens": [[1, 5], [2, 8], [3, 2], [6, 6]], "top_logprobs": [
        [[[1, -0.1]], [[5, -0.69], [4, -0.72]]], [[[2, -0.1]], [[8, -0.5], [7, -0.6]]],
        [[[3, -0.1]], [[2, -0.3], [9, -0.35]]], [[[6, -0.1]], [[6, -0.1]]]]}
    judged = evaluate.judge_divergences(base, cand, tie_nats=0.125)
    assert (judged["near_ties"], judged["mismatches"]) == (1, 2)
    tie, wrong, outside = judged["divergences"]
    assert (tie["sequence"], tie["position"], tie["kind"]) == (0, 1, "near-tie")
    assert tie["baseline_gap_nats"] == pytest.approx(0.05) and tie["candidate_gap_nats"] == pytest.approx(0.03)
    assert wrong["kind"] == "mismatch" and wrong["baseline_gap_nats"] == pytest.approx(2.0)
    assert outside["kind"] == "mismatch" and outside["baseline_gap_nats"] is None
    # Token 2 is outside the baseline's list, so its gap is at least 9's -0.2 down to the list's last, -3.0.
    assert outside["disagreement_at_least_nats"] == pytest.approx(2.8 + 0.05)
    assert tie["disagreement_at_least_nats"] == pytest.approx(tie["disagreement_nats"])
    # A tolerance of 0 counts every difference; a looser one takes sequence 1 in.
    assert evaluate.judge_divergences(base, cand, tie_nats=0.0)["mismatches"] == 3
    assert evaluate.judge_divergences(base, cand, tie_nats=2.5)["near_ties"] == 2
    # Without log-probabilities (an engine that returned none) every difference is a mismatch.
    assert evaluate.judge_divergences(greedy(base["tokens"]), greedy(cand["tokens"]), 0.125)["mismatches"] == 3
    # A sequence that is only shorter is a mismatch too.
    short = evaluate.judge_divergences(greedy([[1, 2, 3]]), greedy([[1, 2]]), 10.0)["divergences"]
    assert short[0]["position"] == 2 and short[0]["candidate_token"] is None and short[0]["kind"] == "mismatch"


def test_a_sequence_one_engine_did_not_return_is_a_mismatch():
    # The candidate returned one sequence of two: MATCH is 1/2 and correctness fails, whichever engine it was.
    row = evaluate.compare_workload("LLM.mixed", greedy([[1, 2], [3, 4]]), greedy([[1, 2]]),
                                    timings([1.0, 1.0], [1.0, 1.0]))
    assert (row["matches"], row["sequences"], row["mismatches"]) == (1, 2, 1)
    assert row["divergences"] == [{"sequence": 1, "position": 0, "baseline_token": 3, "candidate_token": None,
                                   "missing": "candidate", "kind": "mismatch"}]
    assert row["divergence"] == {"sequence": 1, "position": 0, "baseline_token": 3, "candidate_token": None}
    extra = evaluate.judge_divergences(greedy([[1, 2]]), greedy([[1, 2], [5]]), 1.0)
    assert extra["mismatches"] == 1 and extra["divergences"][0]["missing"] == "baseline"
    text = printed([row], "FAIL")
    assert "1/2" in text and "mixed: sequence 1: the candidate engine returned no such sequence: mismatch" in text


def test_a_near_tie_is_judged_by_the_engines_disagreement_not_by_each_gap():
    # Each engine prefers its own token by 0.08 nats: each gap is within 0.125, but the engines disagree on
    # log p(4) - log p(5) by 0.16 nats (+0.08 against -0.08).
    base = {"tokens": [[4]], "top_logprobs": [[[[4, -0.70], [5, -0.78]]]]}
    cand = {"tokens": [[5]], "top_logprobs": [[[[5, -0.70], [4, -0.78]]]]}
    (judged,) = evaluate.judge_divergences(base, cand, tie_nats=0.125)["divergences"]
    assert judged["disagreement_nats"] == pytest.approx(0.16) and judged["kind"] == "mismatch"
    assert evaluate.judge_divergences(base, cand, tie_nats=0.16 + 1e-9)["near_ties"] == 1
    assert evaluate.disagreement(0.25, None) is None and evaluate.disagreement(0.25, 0.5) == 0.75


def test_a_disagreement_at_the_tolerance_is_a_near_tie_through_fp32_rounding():
    # The H200's Qwen3-8B-shaped pair of 2026-12-06: both gaps two bf16 steps (0.5 nats) as fp32 log-probabilities
    # return them, 1.0000002 nats in all: at the default tolerance, not beyond it. A step more is still a mismatch.
    def pair(gap):
        base = {"tokens": [[143772]], "top_logprobs": [[[[143772, -11.75], [103428, -11.75 - gap]]]]}
        cand = {"tokens": [[103428]], "top_logprobs": [[[[103428, -11.75], [143772, -11.75 - gap]]]]}
        return evaluate.judge_divergences(base, cand, tie_nats=evaluate.DEFAULT_TIE_NATS)["divergences"][0]
    edge = pair(0.5000001192092896)
    assert edge["disagreement_nats"] > evaluate.DEFAULT_TIE_NATS and edge["kind"] == "near-tie"
    assert pair(0.625)["kind"] == "mismatch"


def test_the_default_tolerance_covers_stock_against_stock_on_the_h200():
    """The committed self-test (two stock vLLM engines, Llama-3-8B shapes, H200) is the default's evidence:
    every divergence it saw is a near-tie at the default, by a margin of at least one bf16 step (0.25)."""
    path = (Path(__file__).resolve().parents[2] / "results/h200/engines/2026-12-03/selftest-llama3-8b-vllm"
            / "h200-llama3-8b-vllm.json")
    divergences = [d for row in json.loads(path.read_text())["scenarios"][0]["rows"] for d in row["divergences"]]
    apart = [evaluate.disagreement(d["baseline_gap_nats"], d["candidate_gap_nats"]) for d in divergences]
    assert len(apart) == 46 and None not in apart
    assert max(apart) + 0.25 <= evaluate.DEFAULT_TIE_NATS + 1e-6


def test_near_ties_pass_and_show_in_the_match_column():
    base = {"tokens": [[1, 4], [2, 2]], "input_lens": [5, 5],
            "top_logprobs": [[[[1, 0.0]], [[4, -0.70], [5, -0.75]]], [[[2, 0.0]], [[2, 0.0]]]]}
    cand = {"tokens": [[1, 5], [2, 2]], "input_lens": [5, 5],
            "top_logprobs": [[[[1, 0.0]], [[5, -0.69], [4, -0.72]]], [[[2, 0.0]], [[2, 0.0]]]]}
    row = evaluate.compare_workload("LLM.mixed", base, cand, timings([1.0, 1.0], [1.0, 1.0]))
    assert (row["matches"], row["near_ties"], row["mismatches"]) == (1, 1, 0)
    assert row["logprobs"] == {"baseline": True, "candidate": True} and row["tie_nats"] == evaluate.DEFAULT_TIE_NATS
    assert evaluate._match(row) == "1/2 +1 tie"
    text = printed([row], "PASS", self_test=True)
    assert "1/2 +1 tie" in text and "correctness: PASS" in text
    assert ("mixed: sequence 0 first differs at output position 1 (baseline token 4, candidate 5); gaps: baseline "
            "0.050 nats, candidate 0.030 nats (disagreement 0.080): near-tie") in text


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
    rows = [evaluate.compare_workload("LLM.mixed", greedy([[1, 2], [3, 4]]), greedy([[1, 2], [3, 5]]),
                                      timings([0.9, 0.9], [1.0, 1.0])),
            evaluate.compare_workload("LLM.single_request", greedy([[1, 2, 3]]), greedy([[1, 2, 3]]),
                                      timings([0.5, 0.5], [0.4, 0.4]))]
    text = printed(rows, "FAIL", replaced=["SiluAndMul"])
    for expected in ("THROUGHPUT SUMMARY", "correctness: FAIL", "BASELINE tok/s", "MATCH", "1/2", "0.90x",
                     "95% CI", "[0.90, 0.90]", "candidate slower", "LATENCY SUMMARY", "BASELINE med", "0.5000s",
                     "1.25x", "candidate faster", "mixed: sequence 1 first differs at output position 1",
                     "outside the top log-probabilities: mismatch",
                     "paired A/B, order ABBA", "CPU timings",
                     "SPEEDUP: the median of the rounds' paired ratios"):
        assert expected in text, expected


def test_the_table_shows_enough_decimals_for_the_verdict():
    # The 2026-12-04 vLLM self-test's shape: every round 1.003-1.011 faster. At two decimals its interval would
    # read [1.00, 1.01] beside "candidate faster".
    row = evaluate.compare_workload("LLM.single_request", greedy([[1, 2, 3]]), greedy([[1, 2, 3]]),
                                    timings([1.003, 1.011, 1.005, 1.008, 1.004, 1.009, 1.006, 1.007], [1.0] * 8))
    assert row["verdict"] == "candidate faster"
    assert evaluate._interval(row).startswith("[1.004, 1.00") and evaluate._paired_cells(row)[0] == "1.006x"
    wide = evaluate.compare_workload("LLM.single_request", greedy([[1]]), greedy([[1]]),
                                     timings([0.9, 1.1, 1.0, 0.95], [1.0] * 4))
    assert wide["verdict"] == "within noise" and evaluate._interval(wide).startswith("[0.9")
    assert evaluate._paired_cells(wide)[0] == "0.97x"


def test_weight_copies_are_read_per_engine_start():
    # With --restarts 2 the candidate engine started twice: 8 copies are 4 layers' worth per start.
    row = evaluate.compare_workload("LLM.single_request", greedy([[1]]), greedy([[1]]), timings([1.0, 1.0], [1.0, 1.0]))
    text = printed([row], "PASS", replaced=["fused_gated_mlp"], weights_prepared={"fused_gated_mlp": 8},
                   engine_starts=2)
    assert ("candidate worker: weight copies prepared {'fused_gated_mlp': 8} over its 2 engine starts (a few per "
            "layer and start; more means copies made per call)") in text
    assert "(a few per layer; more" in printed([row], "PASS", weights_prepared={"fused_gated_mlp": 4})


def test_a_candidate_whose_kv_cache_holds_fewer_tokens_is_flagged():
    # The H100 pair of 2026-12-05: a weight copy beside the model left the candidate half the KV cache.
    row = evaluate.compare_workload("LLM.single_request", greedy([[1]]), greedy([[1]]), timings([1.0, 1.0], [1.0, 1.0]))
    halved = printed([row], "PASS", kv_cache_tokens={"baseline": 106352, "candidate": 54832})
    assert ("KV cache: baseline 106,352 tokens, candidate 54,832 (0.516x): the candidate's engine holds fewer "
            "tokens") in halved
    # The copy-free blocks on the H200 (2026-12-06): within a profile run's activation peak, not flagged.
    same = printed([row], "PASS", kv_cache_tokens={"baseline": 282864, "candidate": 280560})
    assert "KV cache: baseline 282,864 tokens, candidate 280,560 (0.992x)" in same and "holds fewer" not in same
    assert "KV cache" not in printed([row], "PASS")  # a result file written before the engines reported it


def test_a_self_test_with_a_candidate_folder_is_refused(tmp_path):
    with pytest.raises(WorkflowError, match="--self-test runs the stock engine against itself and takes no "
                                            "candidate folder; got --candidates"):
        evaluate.check_self_test(True, tmp_path)
    evaluate.check_self_test(True, None)


def test_the_chart_is_drawn_for_rows_with_near_ties(tmp_path):
    pytest.importorskip("matplotlib")
    from sk.workflow import eval_chart

    row = {"purpose": "latency", "name": "decode-batch-8", "speedup": 1.02, "interval": [0.98, 1.06], "matches": 7,
           "sequences": 8, "near_ties": 1, "baseline_median_s": 0.2, "candidate_median_s": 0.19}
    document = {"scenarios": [{"scenario": {"model": "sk-tiny/llama"}, "rows": [row, row | {"near_ties": 0}]}],
                "scenario_file": "tiny.yaml", "date": "2026-12-02"}
    path = eval_chart.write_chart(document, tmp_path / "tiny.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _FakeEngine:
    """An engine process as sk eval drives it: each batch of a variant takes that variant's time plus a cost of
    its start slot (the engine started second is slower), less `carry_over` when the batch before it on the
    device was this engine's own; every call is logged."""

    SLOT_COST_S = 0.1

    def __init__(self, log, seconds, scenario, *, label, env, progress, candidates, slot, engines, log_path,
                 last_batch, carry_over=0.0, slot_cost=SLOT_COST_S, **settings):
        self.variant, self.slot, self.log, self.seconds = label.split()[0], slot, log, seconds
        self.last_batch, self.carry_over, self.slot_cost = last_batch, carry_over, slot_cost
        log.append(("start", self.variant, slot, log_path.name))

    def wait_ready(self):
        pass

    def call(self, name, description="", workload=None):
        self.log.append((name, self.variant, self.slot))
        if name == "match":
            return {"tokens": [[1, 2]], "input_lens": [3], "top_logprobs": None}
        if name == "batch":
            follows_itself, self.last_batch[0] = self.last_batch[0] is self, self
            return {"elapsed_s": self.seconds[self.variant] + self.slot_cost * self.slot
                    - self.carry_over * follows_itself, "output_tokens": 2, "started_at": 0.0}
        return {"environment": {"vllm": "0.32.0", "torch": "2.13", "device": "cpu"}, "candidates_replaced": None}

    def close(self):
        self.log.append(("close", self.variant, self.slot))

    def __enter__(self):  # as EngineProcess: a context manager that closes the engine on exit
        return self

    def __exit__(self, *exc):
        self.close()


def _evaluate_with_fakes(monkeypatch, tmp_path, restarts, seconds, rounds=4, carry_over=0.0):
    log, last_batch = [], [None]
    fake = {"last_batch": last_batch, "carry_over": carry_over, "slot_cost": 0.0 if carry_over else 0.1}
    monkeypatch.setattr(evaluate, "EngineProcess", lambda *a, **k: _FakeEngine(log, seconds, *a, **k, **fake))
    scenario = Scenario(model="sk-tiny/llama", dtype="float32", workloads=["LLM.single_request"])
    result = evaluate.evaluate_scenario(scenario, out_dir=tmp_path, stem="s", rounds=rounds, self_test=True,
                                        candidates=None, run_settings={"enforce_eager": True}, restarts=restarts)
    return result, log


def test_the_engine_started_second_is_what_a_plain_pair_measures(monkeypatch, tmp_path):
    # Two equally fast variants: the plain pair starts the baseline first, so the candidate pays the slot cost.
    result, log = _evaluate_with_fakes(monkeypatch, tmp_path, 1, {"baseline": 1.0, "candidate": 1.0})
    (row,) = result["rows"]
    assert row["speedup"] == pytest.approx(1.0 / 1.1) and row["verdict"] == "candidate slower"
    assert [e[1:] for e in log if e[0] == "start"] == [("baseline", 0, "s.sk-tiny--llama-tp1-float32.baseline.log"),
                                                        ("candidate", 1, "s.sk-tiny--llama-tp1-float32.candidate.log")]
    assert result["settings"]["start_orders"] == ["baseline first"]


def test_crossed_start_orders_cancel_the_slot_and_match_once(monkeypatch, tmp_path):
    result, log = _evaluate_with_fakes(monkeypatch, tmp_path, 2, {"baseline": 1.0, "candidate": 1.0})
    (row,) = result["rows"]
    # Two rounds with the candidate on slot 1 (ratio 1/1.1), two with it on slot 0 (ratio 1.1): the median is
    # 1.00 (the plain pair's 0.909 is gone), and the interval holds both pairs' ratios.
    assert row["rounds"] == 4 and row["speedup"] == pytest.approx(1.0)
    assert row["interval"][0] == pytest.approx(1 / 1.1) and row["interval"][1] == pytest.approx(1.1)
    assert row["verdict"] == "within noise"
    assert row["pair_speedups"] == pytest.approx([1 / 1.1, 1.1])
    assert [t["pair"] for t in row["timings"]["baseline"]] == [0, 0, 1, 1]
    starts = [(v, slot) for e, v, slot, *_ in log if e == "start"]
    assert starts == [("baseline", 0), ("candidate", 1), ("candidate", 0), ("baseline", 1)]
    assert [e[1] for e in log if e[0] == "match"] == ["baseline", "candidate"]  # MATCH in the first order only
    assert {t["start_order"] for t in row["timings"]["candidate"]} == {"baseline first", "candidate first"}
    assert result["settings"]["start_orders"] == ["baseline first", "candidate first"]
    assert result["settings"]["order"] == "ABBA | BAAB"
    # The engine started first leads its order's rounds (after both warm-ups): each variant leads one order.
    batches = [(v, slot) for e, v, slot, *_ in log if e == "batch"]
    assert batches[2] == ("baseline", 0) and batches[2 + 4 + 2] == ("candidate", 0)  # 2 warm-ups, 2 rounds of 2
    # Every engine of both orders is closed, and the second order's logs do not overwrite the first's.
    assert sum(e[0] == "close" for e in log) == 4
    assert len({e[3] for e in log if e[0] == "start"}) == 4
    console = Console(width=250, record=True)
    evaluate.print_scenario(console, result)
    text = console.export_text()
    assert "order ABBA | BAAB, started baseline first then candidate first" in text
    assert "95% bootstrap intervals over engine pairs, then rounds" in text


def test_restarts_alternate_the_start_order_and_each_pair_is_a_group(monkeypatch, tmp_path):
    # Four pairs of two rounds: the slot effect cancels in the pooled median, and the interval, resampling pairs
    # first, reaches both start orders' ratios.
    result, log = _evaluate_with_fakes(monkeypatch, tmp_path, 4, {"baseline": 1.0, "candidate": 1.0}, rounds=8)
    (row,) = result["rows"]
    assert [(v, slot) for e, v, slot, *_ in log if e == "start"] == [
        ("baseline", 0), ("candidate", 1), ("candidate", 0), ("baseline", 1)] * 2
    assert result["settings"]["order"] == "ABBA | BAAB | ABBA | BAAB"
    assert [t["pair"] for t in row["timings"]["candidate"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert row["pair_speedups"] == pytest.approx([1 / 1.1, 1.1] * 2)
    assert row["speedup"] == pytest.approx(1.0)
    assert row["interval"][0] == pytest.approx(1 / 1.1) and row["interval"][1] == pytest.approx(1.1)
    assert len({e[3] for e in log if e[0] == "start"}) == 8  # every pair's logs kept
    console = Console(width=250, record=True)
    evaluate.print_scenario(console, result)
    assert ("single-request: B ÷ A per engine pair, in start order: 0.909, 1.100, 0.909, 1.100"
            in console.export_text())


def test_a_batch_that_follows_its_own_engine_is_not_counted_for_either_variant(monkeypatch, tmp_path):
    # A carry-over: a batch right after its own engine's previous one (warm-ups included) is 1 % faster. Every
    # round pairs one such batch with one that follows the other engine, except where the warm-ups decide:
    # the engine that leads the rounds warms up last, so each variant gets as many of them, in every pair.
    for restarts in (1, 2):
        result, log = _evaluate_with_fakes(monkeypatch, tmp_path / str(restarts), restarts,
                                           {"baseline": 1.0, "candidate": 1.0}, rounds=8, carry_over=0.01)
        (row,) = result["rows"]
        pairs = [row["timings"][v] for v in ("baseline", "candidate")]
        assert [sum(t["elapsed_s"] < 1.0 for t in times) for times in pairs] == [4, 4]
        assert row["speedup"] == pytest.approx(1.0) and row["verdict"] == "within noise"
    batches = [(v, slot) for e, v, slot, *_ in log if e == "batch"]
    assert batches[:3] == [("candidate", 1), ("baseline", 0), ("baseline", 0)]  # warm-ups, then round 1


def test_rounds_split_evenly_into_balanced_pairs():
    for restarts, rounds, wrong in ((2, 1, "a multiple of 4, 2 or more for each of the 2 engine pairs"),
                                    (2, 6, "a multiple of 4"), (1, 3, "a multiple of 2, 2 or more for the engine "
                                                                        "pair"), (1, 1, "a multiple of 2")):
        with pytest.raises(WorkflowError, match=f"--rounds must be {wrong}.*got --rounds {rounds}$"):
            evaluate.check_restarts(restarts, rounds)
    with pytest.raises(WorkflowError, match="--restarts must be 1 or even.*got --restarts 3"):
        evaluate.check_restarts(3, 12)
    with pytest.raises(WorkflowError, match="--restarts must be 1 or more; got 0"):
        evaluate.check_restarts(0, 4)
    assert evaluate.start_orders(1, 2) == [(("baseline", "candidate"), 2)]
    assert evaluate.start_orders(2, 8) == [(("baseline", "candidate"), 4), (("candidate", "baseline"), 4)]
    assert evaluate.start_orders(4, 8) == [(("baseline", "candidate"), 2), (("candidate", "baseline"), 2)] * 2
