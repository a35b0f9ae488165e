"""`sk eval`: each scenario's workloads in the stock engine (baseline) and with our kernels (candidate), paired.

The two engines are separate processes with identical settings, alive side by side on one device with half of
its memory each; only the candidate's switch differs: SK_ADAPTERS=vllm|sglang (our adapter replaces the
engine's layers in every engine process), or with `--candidates DIR` the user's candidate modules
(sk.workflow.candidate_worker replaces the layers they are named after); `--self-test` runs the stock engine
as both. Per workload, after a warm-up batch each, the timed batches alternate A B B A ... over `rounds`
rounds (each from an empty prefix cache: every batch repeats the workload's prompts), and sk.workflow.paired
turns them into a median ratio with its 95% bootstrap interval and a verdict.
Greedy decoding with a fixed number of tokens per request makes the token comparison exact: MATCH (a separate
untimed batch) counts sequences whose token ids agree entirely. A sequence that differs is judged at its first
differing position only (after it the two continue from different text): it is a near-tie when both engines
hold both tokens among their top log-probabilities and disagree on the two tokens' log-probability difference by
at most `tie_nats` (two greedy engines that round differently pick different tokens only there; stock vLLM
against itself does, results/h200/engines/README.md), else a mismatch. Correctness is PASS when no workload has
a mismatch.
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sk import settings
from sk.reports import merge_reports, model_process_reports, read_reports
from sk.workflow import paired, scenarios
from sk.workflow.candidates import candidate_path, load_candidate
from sk.workflow.engine_runner import EngineProcess, progress_bars, start_sharing
from sk.workflow.errors import WorkflowError
from sk.workflow.eval_chart import write_chart
from sk.workflow.operators import OPERATORS
from sk.workflow.workloads import Purpose, resolve

SCHEMA = "standardkernels.eval/4"
# A near-tie's largest disagreement, in nats: four bf16 steps of a logit in [32, 64) (0.25 each). Two stock vLLM
# engines on the H200 disagreed by 0.25-0.75 at every one of their 46 divergences (results/h200/engines/README.md,
# 2026-12-03); a kernel that computes wrong numbers moves a greedy token where the engines' top two are further
# apart, or outside the other's top five.
DEFAULT_TIE_NATS = 1.0
# Engines return fp32 log-probabilities (log-softmax of the logits): a gap of exactly four bf16 steps comes back as
# 1.0000002 nats (results/h200/engines/README.md, 2026-12-06). Each log-probability is off by at most half an fp32
# step (< 4e-6 nats below magnitude 64) and a disagreement sums four of them: 1e-4 covers that with room.
LOGPROB_ROUNDING_NATS = 1e-4
# A candidate engine whose KV cache holds fewer tokens than this share of the baseline's is flagged: our adapter
# keeps no memory beside the engine's weights, so its cache is the stock one's to within a profile run's
# activation peak (0.8 % smaller for Qwen3-8B in vLLM on an H200, 2026-12-06; a folded weight copy once halved it).
KV_CACHE_WARN_RATIO = 0.98


def first_divergence(baseline: list[list[int]], candidate: list[list[int]]) -> dict | None:
    """The first sequence (and position in it) whose tokens differ, or None when all agree (a sequence one
    engine did not return differs at position 0)."""
    for seq, (b, c) in enumerate(itertools.zip_longest(baseline, candidate, fillvalue=[])):
        if b != c:
            position = next((i for i, (x, y) in enumerate(zip(b, c)) if x != y), min(len(b), len(c)))
            return {"sequence": seq, "position": position,
                    "baseline_token": b[position] if position < len(b) else None,
                    "candidate_token": c[position] if position < len(c) else None}
    return None


def _logprob(top: list | None, seq: int, position: int, token: int | None) -> float | None:
    """The log-probability one engine gave `token` at (seq, position), when it is among the kept top ones."""
    try:
        return next(lp for t, lp in top[seq][position] if t == token)
    except (TypeError, IndexError, StopIteration):
        return None


def _lowest_kept(top: list | None, seq: int, position: int) -> float | None:
    """The smallest log-probability one engine kept at (seq, position): a token outside its list is at most this."""
    try:
        return min(lp for _, lp in top[seq][position])
    except (TypeError, IndexError, ValueError):
        return None


def disagreement(baseline_gap: float | None, candidate_gap: float | None) -> float | None:
    """How far two engines disagree on log p(a) − log p(b) at a divergence, a the baseline's token and b the
    candidate's: the baseline's gap log p_B(a) − log p_B(b) plus the candidate's log p_C(b) − log p_C(a)
    (each ≥ 0 for a greedy pick). None where a token is outside an engine's top log-probabilities."""
    return None if baseline_gap is None or candidate_gap is None else baseline_gap + candidate_gap


def judge_divergences(baseline: dict, candidate: dict, tie_nats: float) -> dict:
    """Each differing sequence judged at its first differing position: a near-tie when both engines' top
    log-probabilities hold both tokens and their `disagreement` is at most `tie_nats` (up to the fp32 rounding of
    log-probabilities, `LOGPROB_ROUNDING_NATS`), else a mismatch (also
    where a sequence is shorter, where an engine returned no log-probabilities, and where one engine returned a
    sequence the other did not: "missing" names that engine). {"near_ties", "mismatches", "divergences": per
    differing sequence its position, tokens, both gaps and their disagreement (nats, None where a token is outside
    the top ones; then `disagreement_at_least_nats` bounds it from below) and its kind}."""
    divergences = []
    for seq, (b, c) in enumerate(itertools.zip_longest(baseline["tokens"], candidate["tokens"])):
        if b == c:
            continue
        if b is None or c is None:
            divergences.append({"sequence": seq, "position": 0, "baseline_token": (b or [None])[0],
                                "candidate_token": (c or [None])[0],
                                "missing": paired.BASELINE if b is None else paired.CANDIDATE, "kind": "mismatch"})
            continue
        position = next((i for i, (x, y) in enumerate(zip(b, c)) if x != y), min(len(b), len(c)))
        b_token = b[position] if position < len(b) else None
        c_token = c[position] if position < len(c) else None
        gaps, floors = [], []
        for top, own, other in ((baseline.get("top_logprobs"), b_token, c_token),
                                (candidate.get("top_logprobs"), c_token, b_token)):
            mine, theirs = _logprob(top, seq, position, own), _logprob(top, seq, position, other)
            gaps.append(None if mine is None or theirs is None else mine - theirs)
            lowest = _lowest_kept(top, seq, position) if theirs is None else theirs
            floors.append(None if mine is None or lowest is None else max(mine - lowest, 0.0))
        apart = disagreement(*gaps)
        near_tie = (None not in (b_token, c_token) and apart is not None
                    and abs(apart) <= tie_nats + LOGPROB_ROUNDING_NATS)
        divergences.append({"sequence": seq, "position": position, "baseline_token": b_token,
                            "candidate_token": c_token, "baseline_gap_nats": gaps[0], "candidate_gap_nats": gaps[1],
                            "disagreement_nats": apart,
                            # a token outside a list is at least as far below as the list's last entry
                            "disagreement_at_least_nats": disagreement(*floors) if apart is None else apart,
                            "kind": "near-tie" if near_tie else "mismatch"})
    near_ties = sum(d["kind"] == "near-tie" for d in divergences)
    return {"near_ties": near_ties, "mismatches": len(divergences) - near_ties, "divergences": divergences}


def compare_workload(token: str, baseline: dict, candidate: dict, timings: dict[str, list[dict]],
                     tie_nats: float = DEFAULT_TIE_NATS) -> dict:
    """One row: MATCH of the greedy runs (`baseline`/`candidate`: {"tokens", "input_lens", "top_logprobs"}),
    its divergences judged (`judge_divergences`), and the paired statistics of the timed batches
    (`timings[variant]`: {"elapsed_s", "output_tokens"} per round)."""
    spec = resolve(token).spec
    matches = sum(b == c for b, c in zip(baseline["tokens"], candidate["tokens"]))
    row = {"workload": token, "name": resolve(token).value, "purpose": spec.purpose.value,
           "sequences": max(len(baseline["tokens"]), len(candidate["tokens"])), "matches": matches,
           "divergence": first_divergence(baseline["tokens"], candidate["tokens"]),
           "tie_nats": tie_nats, **judge_divergences(baseline, candidate, tie_nats),
           "logprobs": {v: bool(g.get("top_logprobs")) and any(map(any, g["top_logprobs"]))
                        for v, g in ((paired.BASELINE, baseline), (paired.CANDIDATE, candidate))},
           **paired.summarize([t["elapsed_s"] for t in timings[paired.BASELINE]],
                              [t["elapsed_s"] for t in timings[paired.CANDIDATE]],
                              groups=[t.get("pair", 0) for t in timings[paired.BASELINE]]),
           "timings": timings}
    if spec.purpose is Purpose.THROUGHPUT:
        output_tokens = timings[paired.BASELINE][0]["output_tokens"]
        row.update(input_lens=baseline["input_lens"], output_lens=[len(t) for t in baseline["tokens"]],
                   baseline_tok_s=output_tokens / row["baseline_median_s"],
                   candidate_tok_s=output_tokens / row["candidate_median_s"])
    else:
        row.update(batch_size=spec.batch_size, output_len=spec.output_len)
    return row


def adapter_summary(report_dir: Path, engine: str, engine_starts: int = 1) -> dict:
    """What our adapter did in the candidate's model processes (vLLM workers, SGLang schedulers) over its
    `engine_starts` engine starts (`--restarts`), summed: replaced layers, kernel calls, fallbacks."""
    workers = model_process_reports(read_reports(report_dir, engine))
    if not workers:
        return {"workers": 0, "engine_starts": engine_starts}
    merged = merge_reports(workers)
    fallbacks: dict[str, dict[str, int]] = {}
    for f in merged["coverage"]["fallbacks"]:
        fallbacks.setdefault(f["op"], {}).setdefault(f["reason"], 0)
        fallbacks[f["op"]][f["reason"]] += f["count"]
    return {"workers": len(workers), "engine_starts": engine_starts, "replaced": sorted(merged["replaced"]),
            "kernel_calls": merged["coverage"]["kernel_calls"],
            "weights_prepared": merged["coverage"].get("weights_prepared", {}), "fallbacks": fallbacks}


def _lengths(values: list[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else "var"


def _decimals(r: dict) -> int:
    """Decimals that show what the verdict says: 2, or more where the interval's rounded ends would hold 1.00
    while the interval itself does not (e.g. [1.003, 1.010], "candidate faster")."""
    low, high = r["interval"]
    return next((d for d in (2, 3, 4) if (round(low, d) <= 1 <= round(high, d)) == (low <= 1 <= high)), 5)


def _interval(r: dict) -> str:
    low, high = r["interval"]
    d = _decimals(r)
    return f"[{low:.{d}f}, {high:.{d}f}] ±{r['interval_half_width'] * 100:.1f}%"


def _spread(r: dict) -> str:
    return f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}"


_PAIRED_COLUMNS = ("SPEEDUP", "95% CI", "SPREAD", "VERDICT", "MATCH")


def _paired_cells(r: dict) -> list[str]:
    verdict = r["verdict"] if r["verdict"] == paired.WITHIN_NOISE else f"[bold]{r['verdict']}"
    return [f"{r['speedup']:.{_decimals(r)}f}x", _interval(r), _spread(r), verdict, _match(r)]


def _match(r: dict) -> str:
    cell = f"{r['matches']}/{r['sequences']}"
    if r.get("near_ties"):
        cell += f" +{r['near_ties']} tie{'s' if r['near_ties'] > 1 else ''}"
    return cell if not r.get("mismatches") else f"[bold red]{cell}"


def _gaps(d: dict) -> str:
    if "baseline_gap_nats" not in d:
        return ""

    def gap(value):
        return "outside the top log-probabilities" if value is None else f"{value:.3f} nats"
    total = "" if d.get("disagreement_nats") is None else f" (disagreement {d['disagreement_nats']:.3f})"
    if d.get("disagreement_nats") is None and d.get("disagreement_at_least_nats") is not None:
        total = f" (disagreement at least {d['disagreement_at_least_nats']:.3f})"
    return f"; gaps: baseline {gap(d['baseline_gap_nats'])}, candidate {gap(d['candidate_gap_nats'])}{total}"


# The per-engine columns are each engine's median batch; SPEEDUP is the median of the rounds' ratios, which can
# lie on the other side of 1.00 than the columns' ratio when the rounds are uneven.
_CAPTION = "each engine's column: its median batch; SPEEDUP: the median of the rounds' paired ratios"


def throughput_table(scenario: scenarios.Scenario, rows: list[dict], verdict: str) -> Table:
    table = Table(title=f"THROUGHPUT SUMMARY   {scenario.label}   correctness: {verdict}", title_justify="left",
                  caption=_CAPTION, caption_justify="left")
    for column in ("SCENARIO", "SEQS", "IN", "OUT", "ROUNDS", "BASELINE tok/s", "CANDIDATE tok/s", *_PAIRED_COLUMNS):
        table.add_column(column, justify="left" if column == "SCENARIO" else "right")
    for r in rows:
        out = _lengths(r["output_lens"])
        table.add_row(r["name"], str(r["sequences"]), _lengths(r["input_lens"]),
                      out if out != "var" else f"{statistics.mean(r['output_lens']):.0f}", str(r["rounds"]),
                      f"{r['baseline_tok_s']:,.0f}", f"{r['candidate_tok_s']:,.0f}", *_paired_cells(r))
    return table


def latency_table(scenario: scenarios.Scenario, rows: list[dict]) -> Table:
    table = Table(title=f"LATENCY SUMMARY   {scenario.label}", title_justify="left", caption=_CAPTION,
                  caption_justify="left")
    for column in ("SCENARIO", "BS", "OUT", "ROUNDS", "BASELINE med", "CANDIDATE med", *_PAIRED_COLUMNS):
        table.add_column(column, justify="left" if column == "SCENARIO" else "right")
    for r in rows:
        table.add_row(r["name"], str(r["batch_size"]), str(r["output_len"]), str(r["rounds"]),
                      f"{r['baseline_median_s']:.4f}s", f"{r['candidate_median_s']:.4f}s", *_paired_cells(r))
    return table


def print_scenario(console: Console, result: dict) -> None:
    scenario = scenarios.Scenario.model_validate(result["scenario"])
    throughput = [r for r in result["rows"] if r["purpose"] == Purpose.THROUGHPUT.value]
    latency = [r for r in result["rows"] if r["purpose"] == Purpose.LATENCY.value]
    if throughput:
        console.print(throughput_table(scenario, throughput, result["correctness"]))
    if latency:
        console.print(latency_table(scenario, latency))
    for r in result["rows"]:
        if r.get("pair_speedups"):
            console.print(f"{r['name']}: B ÷ A per engine pair, in start order: "
                          + ", ".join(f"{x:.3f}" for x in r["pair_speedups"]))
        judged = r.get("divergences")
        if judged is None and (d := r["divergence"]):  # a result file written before divergences were judged
            judged = [d | {"kind": "divergence"}]
        for d in (judged or [])[:3]:
            if d.get("missing"):
                console.print(f"[red]{r['name']}: sequence {d['sequence']}: the {d['missing']} engine returned "
                              "no such sequence: mismatch")
                continue
            style = "[yellow]" if d["kind"] == "near-tie" else "[red]"
            console.print(f"{style}{r['name']}: sequence {d['sequence']} first differs at output position "
                          f"{d['position']} (baseline token {d['baseline_token']}, candidate {d['candidate_token']})"
                          f"{_gaps(d)}: {d['kind']}")
        if len(judged or []) > 3:
            console.print(f"{r['name']}: {len(judged) - 3} more differing sequences: {r['near_ties']} near-ties, "
                          f"{r['mismatches']} mismatches in all (the JSON lists each)")
    adapter = result["adapter"]
    if result.get("self_test"):
        console.print("self-test: the candidate is the stock engine too; every interval should contain 1.00")
    elif result["candidates_replaced"] is not None:
        replaced = result["candidates_replaced"]
        console.print("candidate worker: " + (", ".join(f"{cls} <- {path}" for cls, path in replaced.items())
                                              or "[red]no layer replaced"))
    elif adapter["workers"] == 0:
        console.print("[red]candidate: no adapter report from an engine worker: our kernels did not run")
    else:
        calls = {op: n for op, n in adapter["kernel_calls"].items() if n}
        fallbacks = {op: sum(reasons.values()) for op, reasons in adapter["fallbacks"].items()}
        reasons = sorted({reason for rs in adapter["fallbacks"].values() for reason in rs})
        console.print(f"candidate worker: replaced {', '.join(adapter['replaced'])}; Triton kernel calls {calls or 0}; "
                      f"PyTorch-reference calls {fallbacks or 0}" + (f" ({'; '.join(reasons)})" if reasons else ""))
        starts = adapter.get("engine_starts", 1)
        if adapter.get("weights_prepared"):
            console.print(f"candidate worker: weight copies prepared {adapter['weights_prepared']}"
                          + (f" over its {starts} engine starts (a few per layer and start;" if starts > 1 else
                             " (a few per layer;") + " more means copies made per call)")
    kv = result.get("kv_cache_tokens") or {}
    base_kv, cand_kv = kv.get(paired.BASELINE), kv.get(paired.CANDIDATE)
    if base_kv and cand_kv:
        line = f"KV cache: baseline {base_kv:,} tokens, candidate {cand_kv:,} ({cand_kv / base_kv:.3f}x)"
        if cand_kv < base_kv * KV_CACHE_WARN_RATIO:
            line = (f"[red]{line}: the candidate's engine holds fewer tokens (memory it keeps beside the model's "
                    "weights); where the KV cache binds (long contexts, many requests) its throughput pays for it")
        console.print(line)
    env = result["environment"]
    engine = f"SGLang {env['sglang']}" if env.get("engine") == "sglang" else f"vLLM {env['vllm']}"
    started = result["settings"].get("start_orders", [])
    console.print(f"[dim]{engine}, torch {env['torch']}, {env['device']}; "
                  f"{'eager' if result['settings']['enforce_eager'] else 'engine default compilation'}; "
                  f"paired A/B, order {result['settings'].get('order', 'ABBA')}"
                  + (f", started {' then '.join(started)}, 95% bootstrap intervals over engine pairs, then rounds"
                     if len(started) > 1 else ", 95% bootstrap intervals over rounds"))
    if env["device"] == "cpu":
        console.print("[yellow]CPU engine: tok/s, latencies and intervals are CPU timings of a small model (and "
                      "noisy on a shared machine); the MATCH columns are what this run proves.")


def check_candidates(directory: Path) -> None:
    """Refuse, before any engine starts, a folder without candidates or with one that does not match."""
    present = [op for op in OPERATORS.values() if op.vllm_module and candidate_path(directory, op).exists()]
    if not present:
        raise WorkflowError(f"no candidate module in {directory}/ (sk create-stubs writes some)")
    for op in present:
        load_candidate(op, directory)


def check_self_test(self_test: bool, candidates: Path | None) -> None:
    if self_test and candidates is not None:
        raise WorkflowError(f"--self-test runs the stock engine against itself and takes no candidate folder; "
                            f"got --candidates {candidates} (drop one of the two)")


def check_restarts(restarts: int, rounds: int) -> None:
    """The balanced design `sk eval` times: each engine pair runs as many A B rounds as B A rounds, and with
    more than one pair, as many pairs start the baseline first as start the candidate first, all with the same
    rounds. Otherwise an advantage of a batch's place or an engine's start slot would not cancel in the median."""
    if restarts < 1:
        raise WorkflowError(f"--restarts must be 1 or more; got {restarts}")
    if restarts > 1 and restarts % 2:
        raise WorkflowError(f"--restarts must be 1 or even: the engine pairs alternate their start order, and only "
                            f"an even number starts each engine first as often; got --restarts {restarts}")
    if rounds < 2 * restarts or rounds % (2 * restarts):
        pairs = f"each of the {restarts} engine pairs" if restarts > 1 else "the engine pair"
        raise WorkflowError(f"--rounds must be a multiple of {2 * restarts}, 2 or more for {pairs} (as many A B "
                            f"rounds as B A rounds); got --rounds {rounds}")


def start_orders(restarts: int, rounds: int) -> list[tuple[tuple[str, str], int]]:
    """The engine pairs' start orders and the rounds each gets: `restarts` pairs, started baseline first, then
    candidate first, and so on, each with rounds / restarts rounds (`check_restarts`)."""
    check_restarts(restarts, rounds)
    first = (paired.BASELINE, paired.CANDIDATE)
    return [(first if k % 2 == 0 else first[::-1], rounds // restarts) for k in range(restarts)]


def _start_label(started: tuple[str, str]) -> str:
    return f"{started[0]} first"


def _paired_runs(scenario: scenarios.Scenario, started: tuple[str, str], rounds: int, *, out_dir: Path, stem: str,
                 envs: dict[str, dict], folders: dict[str, Path | None], run_settings: dict, progress,
                 log_suffix: str, match: bool, pair_index: int = 0) -> tuple[dict, dict, dict]:
    """Both engines started in the order `started` (the first on slot 0), then per workload MATCH (greedy,
    untimed; when `match`), a warm-up batch each and `rounds` paired rounds. (greedy[token][variant],
    timings[token][variant]: per round {"elapsed_s", "output_tokens", "started_at", "start_order", "pair"},
    info[variant]). `pair_index`: this engine pair's place among the pairs the run starts."""
    order = paired.pairing_order(rounds, lead=started[0])  # the engine started first leads the rounds
    greedy: dict[str, dict] = {}
    timings: dict[str, dict[str, list[dict]]] = {}

    def start(variant: str):
        return lambda slot: EngineProcess(
            scenario, label=f"{variant} {scenario.model}", env=envs[variant], progress=progress,
            candidates=folders[variant], slot=slot, engines=len(started),
            log_path=out_dir / "logs" / f"{stem}.{scenario.slug}.{variant}{log_suffix}.log", **run_settings)
    with contextlib.ExitStack() as stack:
        engines = dict(zip(started, start_sharing(stack, scenario, [start(v) for v in started])))
        for token in scenario.workloads:
            spec = resolve(token).spec
            if match:
                greedy[token] = {v: engines[v].call("match", description=f"{token} MATCH", workload=token)
                                 for v in (paired.BASELINE, paired.CANDIDATE)}
            # Warm-up, first-call costs out of the timing; the engine that leads the rounds warms up last, so
            # that each engine's timed batch follows its own previous batch in as many rounds as the other's.
            for variant in started[::-1]:
                for _ in range(getattr(spec, "warmup", 1)):
                    engines[variant].call("batch", description=f"{token} warm-up", workload=token)
            timings[token] = {paired.BASELINE: [], paired.CANDIDATE: []}
            for r, pair in enumerate(order):
                for variant in pair:
                    batch = engines[variant].call("batch", description=f"{token} round {r + 1}/{rounds}",
                                                  workload=token)
                    timings[token][variant].append(batch | {"start_order": _start_label(started), "pair": pair_index})
        info = {v: engines[v].call("info") for v in (paired.BASELINE, paired.CANDIDATE)}
    return greedy, timings, info


def evaluate_scenario(scenario: scenarios.Scenario, *, out_dir: Path, stem: str, rounds: int, self_test: bool,
                      candidates: Path | None, run_settings: dict, tie_nats: float = DEFAULT_TIE_NATS,
                      restarts: int = 1) -> dict:
    """Both engines side by side, MATCH then the paired timed rounds per workload; the scenario's result. With
    `restarts` > 1 the pair is started that many times, baseline first, then candidate first, and so on, and the
    rounds of all pairs are pooled: an engine's advantage from its start order (slot) cancels in the median ratio,
    and the interval, resampling the pairs and then their rounds (paired.bootstrap_interval), holds what differs
    from one pair of engine instances to the next. In each pair the engine started first leads the rounds
    (A B B A ..., then B A A B ...), so an advantage of a batch's place in the sequence cancels too. MATCH is the
    first pair's."""
    runs = start_orders(restarts, rounds)
    with progress_bars() as progress, tempfile.TemporaryDirectory(prefix="sk-eval-reports-") as reports:
        candidate_env = {} if candidates or self_test else {settings.env_name("adapters"): scenario.engine,
                                                            settings.env_name("report_dir"): reports}
        envs = {paired.BASELINE: {}, paired.CANDIDATE: candidate_env}
        folders = {paired.BASELINE: None, paired.CANDIDATE: candidates}
        done = [_paired_runs(scenario, started, n, out_dir=out_dir, stem=stem, envs=envs, folders=folders,
                             run_settings=run_settings, progress=progress, match=k == 0, pair_index=k,
                             log_suffix="" if k == 0 else f".pair{k + 1}-{started[0]}-first")
                for k, (started, n) in enumerate(runs)]
        greedy, _, info = done[0]
        timings = {token: {v: [batch for _, run_timings, _ in done for batch in run_timings[token][v]]
                           for v in (paired.BASELINE, paired.CANDIDATE)} for token in scenario.workloads}
        rows = [compare_workload(token, greedy[token][paired.BASELINE], greedy[token][paired.CANDIDATE],
                                 timings[token], tie_nats) for token in scenario.workloads]
        adapter = adapter_summary(Path(reports), scenario.engine, engine_starts=restarts)
    passed = all(r["mismatches"] == 0 for r in rows)
    orders = ["".join(paired.order_letters(paired.pairing_order(n, lead=started[0]))) for started, n in runs]
    return {"scenario": scenario.model_dump(), "correctness": "PASS" if passed else "FAIL", "rows": rows,
            "adapter": adapter, "self_test": self_test,
            "candidates_replaced": info[paired.CANDIDATE]["candidates_replaced"],
            "kv_cache_tokens": {v: info[v].get("kv_cache_tokens") for v in (paired.BASELINE, paired.CANDIDATE)},
            "environment": info[paired.BASELINE]["environment"], "settings": run_settings | {
                "rounds": rounds, "order": " | ".join(orders),
                "start_orders": [_start_label(started) for started, _ in runs]}}


def run(scenario_file: str, out_dir: Path, *, enforce_eager: bool, max_layers: int | None,
        max_requests: int | None, candidates: Path | None, console: Console, rounds: int = paired.DEFAULT_ROUNDS,
        self_test: bool = False, workloads: list[str] | None = None, tie_nats: float = DEFAULT_TIE_NATS,
        restarts: int = 1) -> bool:
    """Evaluate every scenario of the file, print the summaries, write JSON + PNG; True when no sequence is a
    mismatch (each agrees, or first differs at a near-tie within `tie_nats`). `workloads`: tokens that replace
    every row's own."""
    check_self_test(self_test, candidates)
    check_restarts(restarts, rounds)
    run_settings = {"enforce_eager": enforce_eager, "max_layers": max_layers, "max_requests": max_requests}
    loaded = scenarios.with_workloads(scenarios.load(scenario_file), workloads)
    scenarios.check_fits(loaded, 2, scenario_file)
    if candidates is not None:
        if any(s.engine != "vllm" for s in loaded):
            raise WorkflowError("--candidates runs candidate modules in vLLM only; the scenario file has "
                                f"{', '.join(sorted({s.engine for s in loaded} - {'vllm'}))} rows")
        check_candidates(candidates)
    results = []
    stem = Path(scenario_file).stem
    for scenario in loaded:
        result = evaluate_scenario(scenario, out_dir=out_dir, stem=stem, rounds=rounds, self_test=self_test,
                                   candidates=candidates, run_settings=run_settings, tie_nats=tie_nats,
                                   restarts=restarts)
        print_scenario(console, result)
        results.append(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    candidate = ("the stock engine (self-test)" if self_test else
                 f"candidate modules in {candidates}" if candidates else "standardkernels adapter")
    document = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "scenario_file": str(scenario_file),
                "settings": run_settings | {"rounds": rounds, "tie_nats": tie_nats, "restarts": restarts},
                "candidate": candidate, "scenarios": results}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    chart = write_chart(document, out_dir / f"{stem}.png")
    console.print(f"results: {json_path}" + (f", {chart}" if chart else " (no PNG chart: matplotlib is not installed)"))
    return all(r["correctness"] == "PASS" for r in results)
