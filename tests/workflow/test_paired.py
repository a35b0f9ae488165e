"""The paired A/B statistics of `sk eval` (sk.workflow.paired): order, bootstrap interval, verdict."""
import pytest

from sk.workflow import paired


def test_rounds_alternate_abba():
    order = paired.pairing_order(4)
    flat = [v[0] for pair in order for v in pair]
    assert "".join("A" if v == "b" else "B" for v in flat) == "ABBAABBA"
    led = [v for pair in paired.pairing_order(4, lead=paired.CANDIDATE) for v in pair]
    assert "".join("A" if v == paired.BASELINE else "B" for v in led) == "BAABBAAB"
    with pytest.raises(ValueError, match="lead must be 'baseline' or 'candidate', got 'stock'"):
        paired.pairing_order(2, lead="stock")
    with pytest.raises(ValueError, match="rounds must be 1 or more, got 0"):
        paired.pairing_order(0)


def test_equal_engines_are_within_noise_and_the_interval_holds_the_median():
    baseline = [1.00, 1.02, 0.99, 1.01, 1.00, 0.98, 1.03, 1.00]
    candidate = [1.01, 1.00, 1.00, 1.02, 0.99, 1.00, 1.01, 0.99]
    row = paired.summarize(baseline, candidate)
    low, high = row["interval"]
    assert low <= row["speedup"] <= high and low <= 1.0 <= high
    assert row["verdict"] == "within noise" and row["rounds"] == 8
    assert row["spread"][0] <= low and row["spread"][1] >= high


def test_a_clear_win_and_a_clear_loss_are_named():
    baseline = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    assert paired.summarize(baseline, [b / 1.2 for b in baseline])["verdict"] == "candidate faster"
    row = paired.summarize(baseline, [b * 1.1 for b in baseline])
    assert row["verdict"] == "candidate slower" and row["speedup"] == pytest.approx(1 / 1.1)


def test_the_bootstrap_is_seeded():
    values = [0.9, 1.1, 1.0, 1.05, 0.97]
    assert paired.bootstrap_interval(values) == paired.bootstrap_interval(values)
    assert paired.bootstrap_interval([2.0]) == (2.0, 2.0)


def test_unpaired_timings_are_refused():
    with pytest.raises(ValueError, match="same number of rounds"):
        paired.summarize([1.0, 1.0], [1.0])
