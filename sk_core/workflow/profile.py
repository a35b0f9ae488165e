"""`sk profile SCENARIO.yaml`: where a step's time goes, per workload, in the engine's model process.

Each scenario row's engine runs alone (stock unless `--sk`), and for each workload one warm-up batch, then,
from an empty prefix cache (the warm-up's prompts are the profiled ones), one batch under torch.profiler inside
the process that runs the model (vLLM: the worker, through sk.workflow.profile_worker; SGLang: the scheduler,
through its own profiler). The device's kernels are classified by name (sk.workflow.kernel_profile): GPU time
and share per class, the sum of idle gaps between kernels, kernels per engine step. Writes JSON and a
stacked-bar PNG beside it. `sk profile --compare BASE.json CAND.json` sets two such files side by side (before
and after: which kernels went away, what each step spends now), per engine step; `sk profile --both` profiles
stock and ours one after the other on one device and writes that comparison too (kernel times compare only
between profiles of one card: each file records the card's UUID); `--both --side-by-side` starts both engines
first, each with its share of the device as `sk eval` pairs them, and profiles one while the other idles.

Beside each latency workload's profile, vLLM's decode step on the GPU alone: its FULL CUDA graph of the batch,
replayed back to back between CUDA events (sk.workflow.profile_worker), with neither the profiler nor the host's
step loop in it. With `--side-by-side` the two engines' graphs are also replayed in paired rounds (A B B A ..., as
`sk eval` times batches), which gives the ratio of their GPU time per step with an interval. And the host's side of
each vLLM batch (`host`: each step's `execute_model` time, the garbage collector's pauses, our report writes;
sk.workflow.profile_worker.HostTimes), for a step whose window grows while its GPU time does not. Ours runs as
`sk eval` runs it, its reports kept written (under OUT/reports/).
"""
from __future__ import annotations

import contextlib
import datetime
import io
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sk import settings
from sk.workflow import paired, scenarios
from sk.workflow.engine_runner import EngineProcess, progress_bars, start_sharing
from sk.workflow.errors import WorkflowError
from sk.workflow.kernel_profile import CLASSES, rank_path

SCHEMA = "standardkernels.profile/1"


def profile_table(scenario: scenarios.Scenario, variant: str, rows: dict[str, dict]) -> Table:
    device = next(iter(rows.values()))["device"]
    unit = "GPU" if device == "cuda" else "CPU"
    table = Table(title=f"WHERE THE TIME GOES   {scenario.label}   {variant}   ({unit} time per class, share)",
                  title_justify="left")
    for column in ("WORKLOAD", "STEPS", f"{unit} ms", *(c.upper() for c in CLASSES), "IDLE GAPS ms",
                   "KERNELS/STEP" if device == "cuda" else "OPS/STEP"):
        table.add_column(column, justify="left" if column == "WORKLOAD" else "right")
    for token, r in rows.items():
        per_step = f"{r['kernels_per_step']:.0f}" if r["kernels_per_step"] else "-"
        table.add_row(token, str(r["steps"] or "-"), f"{r['busy_us'] / 1e3:,.1f}",
                      *(f"{r['classes'][c]['us'] / 1e3:,.1f} ({r['classes'][c]['share'] * 100:.0f}%)" for c in CLASSES),
                      f"{r['idle_gap_us'] / 1e3:,.1f}", per_step)
    caption = [f"host, {token}: {host_line(r['host'])}" for token, r in rows.items() if r.get("host")]
    overlapped = {token: r["overlapped_us"] for token, r in rows.items() if r.get("overlapped_us")}
    if overlapped:
        caption.append("kernels that overlapped (dependent launches, streams) count once, for the one that began "
                       "first: " + ", ".join(f"{token} {us / 1e3:,.1f} ms" for token, us in overlapped.items()))
    if caption:
        table.caption = "\n".join(caption)
        table.caption_justify = "left"
    return table


def host_line(host: dict) -> str:
    """A profiled batch's host side in words (sk.workflow.profile_worker.HostTimes)."""
    steps = host["step_ms"]
    first = f"first step {steps[0]:,.2f} ms, median {host['median_step_ms']:,.2f} ms, slowest {max(steps):,.2f} ms " \
            f"in execute_model" if steps else "no engine step"
    gc, writes, allocator = host["gc"], host["report_writes"], host.get("allocator")
    memory = ("" if allocator is None else
              f"; CUDA allocator: {allocator['device_allocs']} cudaMalloc, {allocator['device_frees']} cudaFree, "
              f"{allocator['alloc_retries']} retries")
    return (f"{first}; {gc['count']} GC pauses, {gc['total_ms']:,.2f} ms (longest {gc['max_ms']:,.2f}); "
            f"{writes['count']} report writes, {writes['total_ms']:,.2f} ms{memory}")


def host_rows(host: dict | None) -> dict[str, float | None]:
    """The host rows of `compare`, ms per batch (None where the profile recorded no host side: SGLang, older
    files)."""
    steps = (host or {}).get("step_ms") or []
    return {"host: first step in execute_model (ms)": steps[0] if steps else None,
            "host: median step in execute_model (ms)": host["median_step_ms"] if steps else None,
            "host: slowest step in execute_model (ms)": max(steps) if steps else None,
            "host: GC pauses, whole batch (ms)": host["gc"]["total_ms"] if host else None,
            "host: report writes, whole batch (ms)": host["report_writes"]["total_ms"] if host else None}


def compare(base: dict, cand: dict) -> list[dict]:
    """Two `sk profile` documents side by side: per workload profiled in both (scenario rows matched by model and
    engine), per engine step in each, the busy time, idle gaps and kernels, each class's time, and each kernel of
    either's top list (None where a kernel is not among a document's top ones: it ran for less, or not at all);
    `gpus`: the UUIDs of the cards each ran on ("cpu" on the CPU engine; None where a file predates them)."""
    def per_step(r: dict, us: float | None) -> float | None:
        return None if us is None else us / (r["steps"] or 1)

    def rows_of(document: dict) -> dict:
        return {(s["scenario"]["model"], s["scenario"]["engine"]): s for s in document["scenarios"]}
    base_rows, cand_rows = rows_of(base), rows_of(cand)
    found = []
    for key, b_row in base_rows.items():
        if key not in cand_rows:
            continue
        for token, b in b_row["workloads"].items():
            c = cand_rows[key]["workloads"].get(token)
            if c is None:
                continue
            c_host = host_rows(c.get("host"))
            lines = {"busy": (b["busy_us"], c["busy_us"]), "idle gaps": (b["idle_gap_us"], c["idle_gap_us"]),
                     **{cls: (b["classes"][cls]["us"], c["classes"][cls]["us"]) for cls in CLASSES}}
            b_top = {k["name"]: k for k in b["top_kernels"]}
            c_top = {k["name"]: k for k in c["top_kernels"]}
            kernels = [{"name": name, "class": (b_top.get(name) or c_top[name])["class"],
                        "base_us": per_step(b, b_top[name]["us"] if name in b_top else None),
                        "cand_us": per_step(c, c_top[name]["us"] if name in c_top else None)}
                       for name in dict.fromkeys([*b_top, *c_top])]
            kernels.sort(key=lambda k: -max(k["base_us"] or 0.0, k["cand_us"] or 0.0))
            found.append({"model": key[0], "engine": key[1], "workload": token, "steps": (b["steps"], c["steps"]),
                          "gpus": (device_id(b_row), device_id(cand_rows[key])),
                          "kernels_per_step": (b["kernels_per_step"], c["kernels_per_step"]),
                          "graph_replay_us": (b.get("graph_replay_us"), c.get("graph_replay_us")),
                          "host_ms": {name: (x, c_host[name]) for name, x in host_rows(b.get("host")).items()},
                          "per_step_us": {name: (per_step(b, x), per_step(c, y)) for name, (x, y) in lines.items()},
                          "kernels": kernels})
    if not found:
        raise WorkflowError("sk profile --compare: the two files share no workload of the same model and engine "
                            f"(base: {sorted(base_rows)}, candidate: {sorted(cand_rows)})")
    return found


def device_id(row: dict) -> str | None:
    """A scenario row's device: the card's UUID, "cpu", or None where the file does not record it."""
    environment = row.get("environment", {})
    return environment.get("device_uuid") or ("cpu" if environment.get("device") == "cpu" else None)


def different_cards(gpus: tuple[str | None, str | None]) -> bool:
    """Both profiles' cards are recorded, and they differ."""
    return None not in gpus and gpus[0] != gpus[1]


def same_card(gpus: tuple[str | None, str | None]) -> str:
    """Whether a comparison's two profiles ran on one card, in words: kernel times compare only then."""
    if None in gpus:
        return "Which card each profile ran on is not recorded in both files."
    if not different_cards(gpus):
        return "Both ran on one device." if gpus[0] == "cpu" else "Both ran on one card."
    return (f"DIFFERENT CARDS ({gpus[0]} and {gpus[1]}): the times above mix the cards' difference with the "
            "variants' (two cards of one model can differ in a kernel's time by as much as a variant changes it); "
            "profile both variants on one card, as `sk eval` pairs them.")


def compare_tables(rows: list[dict], base_label: str, cand_label: str) -> list[Table]:
    """`compare`'s rows as tables: µs per engine step, base and candidate, and the difference."""
    def us(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    def diff(x: float | None, y: float | None) -> str:
        return "-" if x is None or y is None else f"{y - x:+,.1f}"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.2f} ms"

    def diff_ms(x: float | None, y: float | None) -> str:
        return "-" if x is None or y is None else f"{y - x:+,.2f} ms"
    tables = []
    for r in rows:
        table = Table(title=f"PER ENGINE STEP   {r['model']} ({r['engine']})   {r['workload']}   "
                            f"{base_label} -> {cand_label}", title_justify="left")
        table.add_column("", no_wrap=True, overflow="ellipsis", max_width=70)
        for column in ("CLASS", f"{base_label} µs", f"{cand_label} µs", "DIFFERENCE µs"):
            table.add_column(column, justify="left" if column == "CLASS" else "right")
        for name, (x, y) in r["per_step_us"].items():
            table.add_row(name, "", us(x), us(y), diff(x, y))
        b_k, c_k = r["kernels_per_step"]
        replayed = r["graph_replay_us"]
        table.add_row("kernels", "", us(b_k), us(c_k), diff(b_k, c_k), end_section=replayed == (None, None))
        if replayed != (None, None):
            table.add_row("decode graph replayed (µs, no profiler)", "", us(replayed[0]), us(replayed[1]),
                          diff(*replayed), end_section=True)
        host = {name: pair for name, pair in r["host_ms"].items() if pair != (None, None)}
        for i, (name, (x, y)) in enumerate(host.items()):
            table.add_row(name, "", ms(x), ms(y), diff_ms(x, y), end_section=i == len(host) - 1)
        for k in r["kernels"]:
            table.add_row(k["name"], k["class"], us(k["base_us"]), us(k["cand_us"]),
                          diff(k["base_us"], k["cand_us"]))
        steps = " and ".join("unknown (whole batch)" if n is None else str(n) for n in r["steps"])
        table.caption = ("kernels: each file's top ones by time; '-' where a kernel is not among a file's top "
                         f"ones. Steps profiled: {steps}. {same_card(r['gpus'])}")
        table.caption_justify = "left"
        tables.append(table)
    return tables


def run_compare(base_file: str, cand_file: str, console: Console, *also: Console) -> None:
    """The two files' comparison, printed to `console` and to each of `also` (read and compared once)."""
    documents = []
    for path in (base_file, cand_file):
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise WorkflowError(f"sk profile --compare: cannot read {path} as JSON: {e}") from e
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise WorkflowError(f"sk profile --compare: {path} is not an `sk profile` file (schema {SCHEMA})")
        documents.append(document)
    labels = [f"{d['variant']} ({d['date'][:10]})" for d in documents]
    if labels[0] == labels[1]:
        labels = ["base", "candidate"]
    rows = compare(*documents)
    tables = compare_tables(rows, *labels)
    for target in (console, *also):
        for table in tables:
            target.print(table)
        if any(different_cards(r["gpus"]) for r in rows):
            target.print("[yellow]sk profile --compare: the two profiles ran on different cards; their kernel "
                         "times do not compare (see the tables' notes)")


def write_chart(document: dict, path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{s['scenario']['model']} {s['scenario']['engine']}\n{token}", r)
            for s in document["scenarios"] for token, r in s["workloads"].items()]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(bars)), 4.5))
    bottoms = [0.0] * len(bars)
    for cls in (*CLASSES, "idle"):
        values = [(r["idle_gap_us"] if cls == "idle" else r["classes"][cls]["us"]) / 1e3 / (r["steps"] or 1)
                  for _, r in bars]
        ax.bar(range(len(bars)), values, bottom=bottoms, label=cls, hatch="//" if cls == "idle" else None,
               color="white" if cls == "idle" else None, edgecolor="grey" if cls == "idle" else None)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=7)
    unit = "GPU" if bars and bars[0][1]["device"] == "cuda" else "CPU"
    known = all(r["steps"] for _, r in bars)
    ax.set_ylabel(f"{unit} ms per engine step" if known else f"{unit} ms (per step where known)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"sk profile {document['scenario_file']} ({document['variant']}, {document['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(scenario_file: str, out_dir: Path, *, with_sk: bool, enforce_eager: bool, max_layers: int | None,
        max_requests: int | None, console: Console, workloads: list[str] | None = None, both: bool = False,
        side_by_side: bool = False) -> None:
    """`workloads`: tokens that replace every row's workloads (e.g. decode batches 1, 8, 64 and a prefill-heavy
    one), validated as a row's are. `both`: stock, then ours, on this machine's device (kernel times compare only
    on one card), each in its own folder under `out_dir` (stock/, sk/), then their comparison, printed and written
    to `out_dir/STEM.compare.txt`: one after the other, or with `side_by_side` both engines up at once, each with
    its share of the device as `sk eval` runs a pair, profiled in turn."""
    if side_by_side and not both:
        raise WorkflowError("sk profile --side-by-side starts the stock engine and ours together: add --both")
    loaded = scenarios.with_workloads(scenarios.load(scenario_file), workloads)
    scenarios.check_fits(loaded, 2 if side_by_side else 1, scenario_file)
    options = dict(enforce_eager=enforce_eager, max_layers=max_layers, max_requests=max_requests)
    variants = (("stock", False), ("sk", True))
    if not both:
        results = [_profile_row(scenario_file, scenario, out_dir, with_sk, console, **options)
                   for scenario in loaded]
        _write_variant(scenario_file, out_dir, with_sk, results, options, console)
        return
    if side_by_side:
        per_variant = {folder: [] for folder, _ in variants}
        for scenario in loaded:
            def start(folder: str, sk_on: bool):
                return lambda slot: _engine(scenario_file, scenario, out_dir / folder, sk_on, progress, slot=slot,
                                            engines=len(variants), **options)
            with progress_bars() as progress, contextlib.ExitStack() as stack:
                engines = start_sharing(stack, scenario, [start(*variant) for variant in variants])
                rows = {folder: _profile_engine(engine, scenario_file, scenario, out_dir / folder)
                        for (folder, _), engine in zip(variants, engines)}
                for token, result in _replayed_in_pairs(*engines, scenario).items():
                    rows["sk"]["workloads"][token]["graph_replay_paired"] = result
            for folder, sk_on in variants:
                per_variant[folder].append(_shown(rows[folder], scenario, sk_on, console))
        paths = [_write_variant(scenario_file, out_dir / folder, sk_on, per_variant[folder],
                                options | {"side_by_side": True}, console)
                 for folder, sk_on in variants]
    else:
        paths = []
        for folder, sk_on in variants:
            results = [_profile_row(scenario_file, scenario, out_dir / folder, sk_on, console, **options)
                       for scenario in loaded]
            paths.append(_write_variant(scenario_file, out_dir / folder, sk_on, results, options, console))
    recorder = Console(width=max(console.width, 160), record=True, file=io.StringIO())
    run_compare(*map(str, paths), console, recorder)
    if side_by_side:
        table = replay_pairs_table(per_variant["sk"])
        for target in (console, recorder):
            target.print(table)
    compare_path = out_dir / f"{Path(scenario_file).stem}.compare.txt"
    compare_path.write_text(f"$ sk profile --compare {paths[0]} {paths[1]}\n" + recorder.export_text())
    console.print(f"comparison: {compare_path}")


def _replayed_in_pairs(baseline: EngineProcess, candidate: EngineProcess, scenario: scenarios.Scenario,
                       rounds: int = 2 * paired.DEFAULT_ROUNDS) -> dict[str, dict]:
    """Per latency workload whose decode graph both engines captured: both graphs replayed in paired rounds
    (sk.workflow.paired's order), each round one median per engine; `paired.summarize` of them (seconds)."""
    engines = {paired.BASELINE: baseline, paired.CANDIDATE: candidate}
    order = paired.pairing_order(rounds)
    found = {}
    for token in scenario.workloads:
        def replayed(who: str) -> float | None:
            return engines[who].call("graph_replay", description=f"{token} graphs replayed in pairs", workload=token)
        if None in (replayed(paired.BASELINE), replayed(paired.CANDIDATE)):  # also the rounds' warm-up
            continue
        seconds = {who: [] for who in engines}
        for pair in order:
            for who in pair:
                seconds[who].append(replayed(who) / 1e6)
        clocks = {who: engines[who].call("graph_clocks", description=f"{token}: the card's clocks under its graph",
                                         workload=token) for who in engines}
        found[token] = {**paired.summarize(seconds[paired.BASELINE], seconds[paired.CANDIDATE]),
                        "order": " ".join(paired.order_letters(order)), "clocks": clocks}
    return found


def clocks_line(clocks: dict) -> str:
    """Each engine's card under its decode graph (sk.workflow.profile_worker.clocks_under) in words."""
    def one(c: dict | None) -> str:
        if not c:
            return "not sampled"
        limits = ", ".join(c["clock_limits"]) or "none"
        return (f"SM {c['sm_mhz_median']:,.0f} MHz (lowest {c['sm_mhz_min']:,.0f}), {c['power_w_median']:,.0f} W, "
                f"clock limits: {limits}")
    return f"stock: {one(clocks.get(paired.BASELINE))}; ours: {one(clocks.get(paired.CANDIDATE))}"


def replay_pairs_table(rows: list[dict]) -> Table:
    """The candidate's paired graph replays (`_replayed_in_pairs`, kept in its rows) as a table."""
    table = Table(title="DECODE GRAPHS REPLAYED IN PAIRS (both engines up; the GPU's time per step, no host, no "
                        "profiler)", title_justify="left")
    for column in ("MODEL", "WORKLOAD", "ROUNDS", "STOCK µs", "OURS µs", "STOCK ÷ OURS", "95% CI", "VERDICT"):
        table.add_column(column, justify="left" if column in ("MODEL", "WORKLOAD", "VERDICT") else "right")
    clocks = []
    for row in rows:
        for token, w in row["workloads"].items():
            r = w.get("graph_replay_paired")
            if r:
                table.add_row(row["scenario"]["model"], token, str(r["rounds"]), f"{r['baseline_median_s'] * 1e6:,.1f}",
                              f"{r['candidate_median_s'] * 1e6:,.1f}", f"{r['speedup']:.3f}×",
                              f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]", r["verdict"])
                if r.get("clocks"):
                    clocks.append(f"{row['scenario']['model']} {token}: {clocks_line(r['clocks'])}")
    if clocks:
        table.caption = "the card under each graph replayed for a second (NVML):\n" + "\n".join(clocks)
        table.caption_justify = "left"
    if not table.rows:
        table.caption = "no decode graph to replay (throughput workloads, eager mode, the CPU engine or SGLang)"
        table.caption_justify = "left"
    return table


def _variant_label(with_sk: bool) -> str:
    return "standardkernels adapter" if with_sk else "stock"


def _engine(scenario_file: str, scenario: scenarios.Scenario, out_dir: Path, with_sk: bool, progress, *,
            enforce_eager: bool, max_layers: int | None, max_requests: int | None, slot: int = 0,
            engines: int = 1) -> EngineProcess:
    """One scenario row's engine in profile mode (stock, or ours with `with_sk`), `slot` of `engines` sharing the
    device (a context manager: ended on exit)."""
    stem = Path(scenario_file).stem
    # Ours as `sk eval` and `sk-serve` run it: its per-process reports kept written (the writer thread's cost is
    # in the profile too), here under `out_dir`/reports.
    env = {settings.env_name("adapters"): scenario.engine,
           settings.env_name("report_dir"): str((out_dir / "reports").resolve())} if with_sk else {}
    return EngineProcess(
        scenario, label=f"profile {scenario.model} ({_variant_label(with_sk)})", env=env, progress=progress,
        mode="profile", enforce_eager=enforce_eager, max_layers=max_layers, max_requests=max_requests, slot=slot,
        engines=engines, log_path=out_dir / "logs" / f"{stem}.{scenario.slug}.profile.log")


def _profile_row(scenario_file: str, scenario: scenarios.Scenario, out_dir: Path, with_sk: bool, console: Console,
                  **options) -> dict:
    """One scenario row profiled by an engine of its own, alone on the device."""
    with progress_bars() as progress, _engine(scenario_file, scenario, out_dir, with_sk, progress, **options) as engine:
        engine.wait_ready()
        row = _profile_engine(engine, scenario_file, scenario, out_dir)
    return _shown(row, scenario, with_sk, console)


def _profile_engine(engine: EngineProcess, scenario_file: str, scenario: scenarios.Scenario, out_dir: Path) -> dict:
    """Each workload of the row on a started engine: a warm-up batch, then one profiled; its traces under
    `out_dir`. Returns the row's result (scenario, environment, workloads)."""
    stem = Path(scenario_file).stem
    workloads = {}
    for token in scenario.workloads:
        engine.call("batch", description=f"{token} warm-up", workload=token)
        trace = out_dir / "traces" / f"{stem}.{scenario.slug}.{token}.rank{{rank}}.trace.json.gz"
        workloads[token] = engine.call("profile", description=f"{token} profiled", workload=token,
                                       keep=str(trace.resolve()))
        workloads[token]["trace"] = rank_path(str(trace), 0)
        workloads[token]["graph_replay_us"] = engine.call("graph_replay", description=f"{token} graph replayed",
                                                          workload=token)
    environment = engine.call("info")["environment"]
    return {"scenario": scenario.model_dump(), "environment": environment, "workloads": workloads}


def _shown(row: dict, scenario: scenarios.Scenario, with_sk: bool, console: Console) -> dict:
    """Prints a profiled row's table (once its engine is closed) and returns the row."""
    console.print(profile_table(scenario, _variant_label(with_sk), row["workloads"]))
    console.print(f"[dim]{row['environment']}")
    if row["environment"]["device"] == "cpu":
        console.print("[yellow]CPU engine: these are CPU ops' times, not GPU kernels'; the classes are the same.")
    return row


def _write_variant(scenario_file: str, out_dir: Path, with_sk: bool, results: list[dict], options: dict,
                   console: Console) -> Path:
    """One variant's profile document (returned), with its PNG, under `out_dir`."""
    stem = Path(scenario_file).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "scenario_file": str(scenario_file), "variant": _variant_label(with_sk),
                "settings": dict(options), "scenarios": results}
    json_path = out_dir / f"{stem}.profile.json"
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    chart = write_chart(document, out_dir / f"{stem}.profile.png")
    console.print(f"results: {json_path}" + (f", {chart}" if chart else " (no PNG: matplotlib is not installed)")
                  + f"; each batch's kernels (Chrome traces, Perfetto opens them): {out_dir / 'traces'}/")
    return json_path
