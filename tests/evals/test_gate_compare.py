"""The gate's comparison on lm-eval-shaped results, without an engine."""
from sk.evals import gate


def _mc(doc_id, scores, label=0):
    return {"doc_id": doc_id, "doc": {"prompt": f"p{doc_id}=", "choices": ["a", "b"]}, "target": label,
            "filtered_resps": [[str(s), "False"] for s in scores], "acc": float(scores[label] == max(scores))}


def _gen(doc_id, text, target="x"):
    return {"doc_id": doc_id, "doc": {"prompt": f"q{doc_id}="}, "target": target, "filtered_resps": [text],
            "exact_match": float(text == target)}


def _run(mc, gen):
    mean = lambda samples, key: sum(s[key] for s in samples) / len(samples)  # noqa: E731
    return {"results": {"sk_synth_mc": {"alias": "sk_synth_mc", "acc,none": mean(mc, "acc"), "acc_stderr,none": 0},
                        "sk_synth_gen": {"exact_match,none": mean(gen, "exact_match")}},
            "samples": {"sk_synth_mc": mc, "sk_synth_gen": gen}}


def test_identical_runs_pass():
    run = _run([_mc(i, [-1.0, -2.0]) for i in range(100)], [_gen(i, "x") for i in range(100)])
    result = gate.compare(run, run, tolerance=0.01)
    assert all(r["ok"] and r["delta"] == 0 for r in result["metrics"])
    assert all(t["ok"] and not t["disagreements"] for t in result["tasks"].values())
    assert result["tasks"]["sk_synth_mc"]["max_loglikelihood_difference"] == 0


def test_flips_that_cancel_in_the_metric_still_fail():
    stock = _run([_mc(i, [-1.0, -2.0], label=i % 2) for i in range(100)], [_gen(i, "x") for i in range(100)])
    # Every item's choice flips: accuracy stays 0.5, but 100 of 100 items are answered differently.
    ours = _run([_mc(i, [-2.0, -1.0], label=i % 2) for i in range(100)], [_gen(i, "x") for i in range(100)])
    result = gate.compare(stock, ours, tolerance=0.01)
    assert all(r["ok"] for r in result["metrics"])
    mc = result["tasks"]["sk_synth_mc"]
    assert not mc["ok"] and len(mc["disagreements"]) == 100
    assert mc["disagreements"][0] == {"doc_id": 0, "prompt": "p0=", "target": "a", "stock": "a", "ours": "b"}


def test_metric_difference_beyond_tolerance_fails():
    mc = [_mc(i, [-1.0, -2.0]) for i in range(100)]
    stock = _run(mc, [_gen(i, "x") for i in range(100)])
    ours = _run(mc, [_gen(i, "x" if i % 10 else "y") for i in range(100)])
    result = gate.compare(stock, ours, tolerance=0.01)
    gen_row = next(r for r in result["metrics"] if r["task"] == "sk_synth_gen")
    assert not gen_row["ok"] and abs(gen_row["delta"] + 0.1) < 1e-9
    assert len(result["tasks"]["sk_synth_gen"]["disagreements"]) == 10
