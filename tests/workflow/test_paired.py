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


def test_unpaired_timings_and_a_single_round_are_refused():
    with pytest.raises(ValueError, match="same number of rounds"):
        paired.summarize([1.0, 1.0], [1.0])
    with pytest.raises(ValueError, match=r"2 or more \(one round has no interval\); got 1 baseline and 1 candidate"):
        paired.summarize([0.63], [0.62])


def test_a_ratio_and_its_inverse_have_the_median_one():
    # A slot effect crossed over two start orders: half the rounds 1.1, half 1/1.1. The arithmetic mean of the
    # middle two would be 1.0045, "candidate faster" by a rounding of the statistic alone.
    row = paired.summarize([1.1, 1.1, 1.0, 1.0], [1.0, 1.0, 1.1, 1.1])
    assert row["speedup"] == pytest.approx(1.0, abs=1e-12)
    assert row["interval"] == pytest.approx([1 / 1.1, 1.1]) and row["verdict"] == "within noise"


def test_one_group_is_the_plain_bootstrap_and_groups_must_match_the_values():
    values = [0.9, 1.1, 1.0, 1.05, 0.97]
    assert paired.bootstrap_interval(values, groups=[3] * 5) == paired.bootstrap_interval(values)
    with pytest.raises(ValueError, match="groups must name one group per value: 2 groups for 5 values"):
        paired.bootstrap_interval(values, groups=[0, 1])


def test_pairs_with_offsets_of_their_own_widen_the_interval_to_hold_them():
    # Four engine pairs, each steady within itself (±0.04 %) but a pair up to 1 % off the others: the rounds
    # alone call the candidate faster; resampling the pairs first puts the pairs' offsets into the interval.
    jitter = [0.0, 0.0004, -0.0004, 0.0002, -0.0002, 0.0003, -0.0003, 0.0001]
    ratios = [offset + j for offset in (0.9995, 1.0095, 1.0005, 1.0085) for j in jitter]
    baseline = [1.0] * len(ratios)
    candidate = [1 / r for r in ratios]
    plain = paired.summarize(baseline, candidate)
    grouped = paired.summarize(baseline, candidate, groups=[k for k in range(4) for _ in jitter])
    assert plain["speedup"] == grouped["speedup"]
    assert plain["verdict"] == "candidate faster" and grouped["verdict"] == "within noise"
    assert grouped["interval"][0] < plain["interval"][0] and grouped["interval"][1] > plain["interval"][1]
    assert grouped["pair_speedups"] == pytest.approx([0.99955, 1.00955, 1.00055, 1.00855])  # jitter's median
    assert "pair_speedups" not in plain


def test_unequal_pairs_draw_as_many_rounds_as_they_hold():
    # Pair 0 has three rounds at 1.0, pair 1 one round at 2.0: a resample drawing pair 1 twice holds two values,
    # both 2.0, never a padding value; drawing pair 0 twice holds six.
    low, high = paired.bootstrap_interval([1.0, 1.0, 1.0, 2.0], groups=["a", "a", "a", "b"])
    assert (low, high) == (1.0, 2.0)


def test_the_rounds_order_reads_as_letters():
    assert paired.order_letters(paired.pairing_order(4)) == ["AB", "BA", "AB", "BA"]
    assert paired.order_letters(paired.pairing_order(3, lead=paired.CANDIDATE)) == ["BA", "AB", "BA"]
