"""The PNG beside `sk eval`'s JSON: baseline vs candidate per workload (medians over the paired rounds, the
ratio's 95% interval under each pair), throughput and latency side by side."""
from __future__ import annotations

from pathlib import Path


def write_chart(document: dict, path: Path) -> Path | None:
    """Write the chart; None when matplotlib is not installed (the JSON and the tables carry the same numbers)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(s["scenario"]["model"], r) for s in document["scenarios"] for r in s["rows"]]
    panels = [("throughput", "output tokens/s (higher is better)", "baseline_tok_s", "candidate_tok_s"),
              ("latency", "median seconds per batch (lower is better)", "baseline_median_s", "candidate_median_s")]
    panels = [p for p in panels if any(r["purpose"] == p[0] for _, r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (purpose, ylabel, base_key, cand_key) in zip(axes[0], panels):
        selected = [(model, r) for model, r in rows if r["purpose"] == purpose]
        xs = range(len(selected))
        ax.bar([x - 0.2 for x in xs], [r[base_key] for _, r in selected], 0.4, label="baseline (stock)")
        ax.bar([x + 0.2 for x in xs], [r[cand_key] for _, r in selected], 0.4, label="candidate (standardkernels)")
        labels = [f"{model}\n{r['name']}\n{r['speedup']:.2f}x [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]\n"
                  f"{r['matches']}/{r['sequences']} match"
                  + (f" +{r['near_ties']} near-tie" if r.get("near_ties") else "") for model, r in selected]
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(purpose)
        ax.legend(fontsize=8)
    fig.suptitle(f"sk eval {document['scenario_file']}  ({document['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
