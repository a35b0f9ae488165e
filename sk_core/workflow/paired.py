"""The statistics of a paired A/B run (`sk eval`): the order of the timed batches, and the verdict per workload.

Baseline (A) and candidate (B) run side by side on one device; round r times one batch of each, in the order
A B in even rounds and B A in odd ones (A B B A A B ...), so that drift in the machine (clocks, heat, other
tenants) hits both equally. Each round gives one ratio, the candidate's speed over the baseline's
(baseline seconds / candidate seconds: above 1 the candidate is faster). The row reports the median ratio (with an
even count, the geometric mean of the middle two: `summarize`), a 95% interval for it from a bootstrap over rounds (numpy,
fixed seed), the spread of the per-round ratios, and
"within noise" when the interval contains 1.00. Pure functions: no engine, no clock.

When the pair was started more than once (`sk eval --restarts`), each engine pair is a group of rounds, and the
interval is a two-level bootstrap: the pairs resampled, then the rounds within each. An engine instance can
carry an offset of its own for as long as it runs (two stock vLLM engines at Llama-3-8B shapes: 0.4-1.1 % at
decode batch 1, the same sign in six pairs; results/h200/engines/README.md, 2026-12-03 and 2026-12-04), which
rounds of one pair cannot show; resampling the pairs puts it into the interval.
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


def order_letters(order: list[tuple[str, str]]) -> list[str]:
    """`pairing_order`'s rounds as letters, A the baseline and B the candidate: ["AB", "BA", ...]."""
    return ["AB" if first == BASELINE else "BA" for first, _ in order]


def bootstrap_interval(values: list[float], *, groups: list[int] | None = None,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `values` (resampled with replacement, fixed seed). With
    `groups` (each value's group, e.g. the engine pair it came from) and more than one group: the groups are
    resampled, then the values within each drawn group."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    if groups is not None and len(groups) != data.size:
        raise ValueError(f"groups must name one group per value: {len(groups)} groups for {data.size} values")
    rng = np.random.default_rng(seed)
    labels = sorted(set(groups)) if groups is not None else []
    if len(labels) > 1:
        medians = _two_level_medians(data, np.asarray(groups), labels, rng, resamples)
    else:
        medians = np.median(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def _two_level_medians(data: np.ndarray, groups: np.ndarray, labels: list, rng: np.random.Generator,
                       resamples: int) -> np.ndarray:
    """Medians of `resamples` two-level resamples: len(labels) groups drawn with replacement, then as many values
    as each drawn group holds, drawn from it with replacement."""
    members = [data[groups == g] for g in labels]
    sizes = np.array([m.size for m in members])
    padded = np.full((len(members), sizes.max()), np.nan)
    for i, m in enumerate(members):
        padded[i, :m.size] = m
    drawn = rng.integers(0, len(members), size=(resamples, len(members)))  # which group fills each place
    picks = np.floor(rng.random((resamples, len(members), sizes.max())) * sizes[drawn][..., None]).astype(int)
    values = padded[drawn[..., None], picks]
    values[np.arange(sizes.max()) >= sizes[drawn][..., None]] = np.nan  # a smaller group draws fewer values
    return np.nanmedian(values.reshape(resamples, -1), axis=1)


def verdict(interval: tuple[float, float]) -> str:
    low, high = interval
    if low <= 1.0 <= high:
        return WITHIN_NOISE
    return "candidate faster" if low > 1.0 else "candidate slower"


def summarize(baseline_s: list[float], candidate_s: list[float], groups: list | None = None, **bootstrap) -> dict:
    """One workload's paired timings (seconds per batch, round by round, 2 rounds or more) -> ratio, interval,
    spread, verdict. `groups`: each round's engine pair (e.g. its start), for the two-level interval and the
    per-pair medians. The medians are taken of the ratios' logarithms, so that an even count's middle two are
    averaged geometrically: a ratio r and its inverse 1/r, as a slot effect crossed over two start orders gives,
    have the median 1.00 (the arithmetic mean of the two, (r + 1/r) / 2, is above it)."""
    if len(baseline_s) != len(candidate_s) or len(baseline_s) < 2:
        raise ValueError(f"paired timings need the same number of rounds, 2 or more (one round has no interval); "
                         f"got {len(baseline_s)} baseline and {len(candidate_s)} candidate")
    ratios = [b / c for b, c in zip(baseline_s, candidate_s)]
    logs = np.log(ratios)
    median = float(np.exp(np.median(logs)))
    interval = tuple(float(np.exp(v)) for v in bootstrap_interval(list(logs), groups=groups, **bootstrap))
    per_pair = {}
    if groups is not None and len(set(groups)) > 1:
        per_pair = {"pair_speedups": [float(np.exp(np.median([v for v, g in zip(logs, groups) if g == label])))
                                      for label in dict.fromkeys(groups)]}
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
        **per_pair,
    }
