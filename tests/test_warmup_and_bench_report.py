"""`sk.warmup` compiles every op before capture; the benchmark report renders tables and plots from results."""
import importlib
import json

import torch

import sk
from numerics import KERNEL_DEVICE
from sk.bench import peers


def test_warmup_runs_every_op_through_its_kernel(monkeypatch):
    # A small "large problem" (3 rows at d = 32, not 32769): both block sizes, in seconds under the interpreter.
    monkeypatch.setattr(importlib.import_module("sk.warmup"), "SMALL_PROBLEM", 64)
    with sk.coverage.strict():
        calls = sk.warmup(hidden_sizes=[64], intermediate_sizes=[32], dtypes=[torch.float32], device=KERNEL_DEVICE)
    counted = sk.coverage.report()["kernel_calls"]
    assert calls == sum(counted.values()) == 11
    assert set(counted) == {"rms_norm", "gemma_rms_norm", "fused_add_rms_norm", "gemma_fused_add_rms_norm",
                            "silu_and_mul", "gelu_and_mul"}


def test_training_warmup_runs_every_backward_kernel_too(monkeypatch):
    # A small "large problem" (3 rows at d = 32) keeps the interpreted run short.
    monkeypatch.setattr(importlib.import_module("sk.warmup"), "SMALL_PROBLEM", 64)
    with sk.coverage.strict():
        calls = sk.warmup(hidden_sizes=[64], intermediate_sizes=[32], dtypes=[torch.float32], device=KERNEL_DEVICE,
                          training=True)
    assert calls == sum(sk.coverage.report()["kernel_calls"].values()) == 11 + 8 + 2 * 6


def test_selfcheck_command_passes(capsys):
    from sk.cli import main

    assert main(["selfcheck"]) == 0
    assert "path taken: kernel" in capsys.readouterr().out


def test_bench_report_renders_markdown_and_plot(tmp_path):
    result = {
        "environment": {"gpu": "NVIDIA H200", "arch": "sm90", "date": "2026-11-29", "torch": "2.11.0",
                        "triton": "3.6.0", "cuda": "13.0"},
        "copy_TBps": 4.27, "dtype": "torch.bfloat16",
        "rows": [
            {"op": "rms_norm", "M": m, "N": 4096, "bytes": 2 * m * 4096 * 2, "us": {"sk": 2.0 * m, "liger": 2.1 * m},
             "sk_us": 2.0 * m, "sk_TBps": 1.0, "sk_pct_copy": 23.4, "floor_us": 1.0, "best_peer": "liger",
             "best_peer_us": 2.1 * m, "sk_vs_best_peer": 1.05}
            for m in (1, 32)
        ],
    }
    text = peers.markdown(result)
    assert "| rms_norm | 32 | 4096 | 64.00 | 67.20 |" in text and "1.05× (liger)" in text
    peers.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    json.dumps(result)


def test_profile_per_step_counts_host_ops_per_call():
    """The benchmark's profile (bench_geglu.py --profile) reports per call, not per profiled run: two matmuls
    a call show as two aten::mm calls whatever the number of steps."""
    from sk.bench.timing import profile_per_step

    a = torch.randn(32, 48)

    def two_products():
        return (a @ a.T) @ a

    profile = profile_per_step(two_products, steps=7)
    mm = next(op for op in profile["host_ops"] if op["name"] == "aten::mm")
    assert mm["calls"] == 2 and mm["self_us"] > 0
    # cProfile's pass: the Python function itself, once a call
    ours = next(f for f in profile["python"] if f["name"].startswith("two_products "))
    assert ours["calls"] == 1 and "test_warmup_and_bench_report.py" in ours["name"]
    assert profile["python_us"] >= ours["self_us"]
    assert profile["host_us"] >= sum(op["self_us"] for op in profile["host_ops"]) * 0.999
    if not torch.cuda.is_available():
        assert profile["kernels"] == []  # CPU ops launch no GPU kernels


def test_l2_cold_copies_stream_three_l2s_between_reads_of_one_copy():
    from sk.bench.timing import l2_cold_copies
    w = torch.randn(64, 32)
    cpu = l2_cold_copies({"w": w})
    assert next(cpu)["w"] is w and next(cpu)["w"] is w  # no GPU cache to evade: the tensor itself
    if not torch.cuda.is_available():
        return
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    w = torch.randn(l2 // 8, device="cuda", dtype=torch.bfloat16)  # a quarter of the L2 each
    b = torch.randn(l2 // 8, device="cuda", dtype=torch.bfloat16)
    cycle = l2_cold_copies({"w": w, "b": b})
    sets = [next(cycle) for _ in range(7)]
    assert sets[0]["w"] is w and sets[6]["w"] is w  # half the L2 a set: 6 sets stream 3 L2s
    assert len({s["w"].data_ptr() for s in sets[:6]}) == 6 and all(torch.equal(s["b"], b) for s in sets)
