"""The statistics of a paired A/B run (`sk eval`): the order of the timed batches, and the verdict per workload.

Baseline (A) and candidate (B) run side by side on one device; round r times one batch of each, in the order
A B in even rounds and B A in odd ones (A B B A A B ...), so that drift in the machine (clocks, heat, other
tenants) hits both equally. Each round gives one ratio, the candidate's speed over the baseline's
(baseline seconds / candidate seconds: above 1 the candidate is faster). The row reports the median ratio, a
95% interval for it from a bootstrap over rounds (numpy, fixed seed), the spread of the per-round ratios, and
"within noise" when the interval contains 1.00. Pure functions: no engine, no clock.
"""
from __future__ import annotations

import numpy as np

BASELINE, CANDIDATE = "baseline", "candidate"
DEFAULT_ROUNDS = 8
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
WITHIN_NOISE = "within noise"


def pairing_order(rounds: int, lead: str = BASELINE) -> list[tuple[str, str]]:
    """The two variants' order in each round, `lead` first in the first: A B, B A, A B, ... (A B B A A B B A over
    time; with the candidate leading, B A A B B A A B)."""
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, got {rounds}")
    if lead not in (BASELINE, CANDIDATE):
        raise ValueError(f"lead must be {BASELINE!r} or {CANDIDATE!r}, got {lead!r}")
    first = (lead, CANDIDATE if lead == BASELINE else BASELINE)
    return [first if r % 2 == 0 else first[::-1] for r in range(rounds)]


def bootstrap_interval(values: list[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `values` (resampled with replacement, fixed seed)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def verdict(interval: tuple[float, float]) -> str:
    low, high = interval
    if low <= 1.0 <= high:
        return WITHIN_NOISE
    return "candidate faster" if low > 1.0 else "candidate slower"


def summarize(baseline_s: list[float], candidate_s: list[float], **bootstrap) -> dict:
    """One workload's paired timings (seconds per batch, round by round) -> ratio, interval, spread, verdict."""
    if len(baseline_s) != len(candidate_s) or not baseline_s:
        raise ValueError(f"paired timings need the same number of rounds, 1 or more; got {len(baseline_s)} "
                         f"baseline and {len(candidate_s)} candidate")
    ratios = [b / c for b, c in zip(baseline_s, candidate_s)]
    median = float(np.median(ratios))
    interval = bootstrap_interval(ratios, **bootstrap)
    return {
        "rounds": len(ratios),
        "ratios": ratios,
        "speedup": median,
        "interval": list(interval),
        # Half the interval's width relative to the median: "±x%" in the tables.
        "interval_half_width": (interval[1] - interval[0]) / 2 / median,
        "spread": [min(ratios), max(ratios)],
        "baseline_median_s": float(np.median(baseline_s)),
        "candidate_median_s": float(np.median(candidate_s)),
        "verdict": verdict(interval),
    }
