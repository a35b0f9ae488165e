"""`sk profile`'s kernel classes and trace summary (sk.workflow.kernel_profile), on real kernel names and a
recorded-style trace (tests/workflow/data/decode_trace.json: two decode steps of vLLM kernels on an H200)."""
import json
from pathlib import Path

import pytest
import torch

from sk.workflow.kernel_profile import CLASSES, classify, load_trace, summarize_trace

TRACE = Path(__file__).parent / "data" / "decode_trace.json"

NAMES = {
    "gemm": [
        "nvjet_tst_128x200_64x4_1x2_h_bz_coopA_NNT",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_"
        "tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
        "void cublasLt::splitKreduce_kernel<32, 16, int, __nv_bfloat16, __nv_bfloat16, float>(...)",
        "triton_tem_fused_mm_0", "aten::addmm", "_gate_up_kernel",
    ],
    "attention": [
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false>(...)",
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
        "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>>, cutlass::bfloat16_t> > > >(...)",
        "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<...> >(...)",
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>(...)",
        "kernel_unified_attention_2d", "_C::cpu_attention_with_kv_cache", "_fwd_kernel_stage1",
        "void vllm::paged_attention_v2_kernel<...>(...)",
    ],
    "norm": [
        "void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(...)",
        "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)",
        "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "_rms_norm_fwd_kernel", "_ln_stats_kernel",
        "aten::layer_norm",
    ],
    "activation": [
        "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>"
        "(c10::BFloat16 const&)), false>(...)",
        "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(...)",
        "triton_poi_fused_mul_silu_slice_1", "void vllm::gelu_tanh_and_mul_kernel<...>(...)", "_act_and_mul_kernel",
        "_C::silu_and_mul",
    ],
    "rotary/kv-cache": [
        "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(...)",
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)",
        "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<...>(...)", "store_kvcache",
        "void vllm::concat_and_cache_mla_kernel<...>(...)", "_C::cpu_attn_reshape_and_cache",
        "vllm::unified_kv_cache_update",
    ],
    "sampling": [
        "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0>(...)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(...)",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>(...)",
        "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>(...)", "_topk_topp_kernel", "aten::argmax",
    ],
    "other": [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(...)",
        "Memcpy DtoH (Device -> Pinned)", "void at::native::index_elementwise_kernel<128, 4>(...)",
    ],
}


@pytest.mark.parametrize("cls, name", [(c, n) for c, names in NAMES.items() for n in names])
def test_real_kernel_names_land_in_their_class(cls, name):
    assert classify(name) == cls


def test_the_trace_summary_sums_classes_gaps_and_kernels_per_step():
    summary = summarize_trace(load_trace(TRACE), steps=2)
    assert summary["device"] == summary["events_from"] == "cuda"
    assert summary["kernels"] == 22 and summary["kernels_per_step"] == 11
    us = {c: summary["classes"][c]["us"] for c in CLASSES}
    assert us == {"gemm": 2 * 51, "attention": 2 * 9, "norm": 2 * 3, "activation": 2 * 4, "rotary/kv-cache": 2 * 4,
                  "sampling": 2 * 5, "other": 2 * 1}
    assert summary["busy_us"] == 2 * 77
    assert sum(c["share"] for c in summary["classes"].values()) == pytest.approx(1.0)
    # 1 µs after each kernel but the last one, and 50 µs of host work between the two steps.
    assert summary["idle_gap_us"] == pytest.approx(21 + 50)


def test_a_cpu_trace_counts_each_op_for_its_exclusive_time():
    trace = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
             {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 8.0},
             {"ph": "X", "cat": "cpu_op", "name": "_C::silu_and_mul", "pid": 1, "tid": 1, "ts": 12.0, "dur": 3.0}]
    summary = summarize_trace(trace, steps=1)
    assert summary["device"] == "cpu" and summary["kernels"] == 3
    assert summary["classes"]["gemm"]["us"] == 10.0 and summary["classes"]["activation"]["us"] == 3.0
    assert summary["busy_us"] == 13.0
    assert summary["idle_gap_us"] == 2.0


def test_overlapping_kernels_count_once_and_the_wait_goes_to_the_kernel_waited_on():
    # PDL: a dependent kernel starts before its predecessor ends and waits for it; a second stream's kernel can lie
    # inside another's span. The classes sum to the time the GPU runs any kernel, never past the window
    # (results/h200/engines/README.md, 2026-12-05 evening: summed whole, 818 ms of kernels in a 624 ms window).
    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}
    trace = [kernel("_rms_norm_kernel", 0.0, 4.0), kernel("_gate_up_kernel", 2.0, 10.0),  # waits 2 µs on the norm
             kernel("_down_kernel", 9.0, 6.0), kernel("triton_poi_fused_0", 10.0, 1.0),  # inside the others
             kernel("nvjet_sm90_tst_64x8", 20.0, 5.0)]
    summary = summarize_trace(trace, steps=1)
    us = {c: summary["classes"][c]["us"] for c in ("norm", "gemm", "other")}
    assert us == {"norm": 4.0, "gemm": 8.0 + 3.0 + 5.0, "other": 0.0}
    assert summary["busy_us"] == 20.0 == summary["window_us"] - summary["idle_gap_us"]
    assert summary["overlapped_us"] == 26.0 - 20.0
    assert {k["name"]: k["us"] for k in summary["top_kernels"]}["_gate_up_kernel"] == 8.0


def test_the_profile_table_says_how_much_overlapped():
    from rich.console import Console

    from sk.workflow import profile, scenarios

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}
    summary = summarize_trace([kernel("_rms_norm_kernel", 0.0, 4000.0), kernel("_down_kernel", 1000.0, 5000.0)],
                              steps=1)
    scenario = scenarios.Scenario.model_validate({"model": "sk-tiny/llama", "engine": "vllm", "dtype": "bfloat16",
                                                  "workloads": ["LLM.decode_batch_1"]})
    console = Console(width=250, record=True)
    console.print(profile.profile_table(scenario, "stock", {"LLM.decode_batch_1": summary}))
    assert "count once, for the one that began first: LLM.decode_batch_1 3.0 ms" in console.export_text()


def test_two_profiles_compare_per_engine_step_class_by_class_and_kernel_by_kernel():
    from rich.console import Console

    from sk.workflow import profile
    from sk.workflow.errors import WorkflowError

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    def document(variant, summaries, model="sk-tiny/qwen3"):
        return {"schema": profile.SCHEMA, "date": "2026-12-06T00:00:00+00:00", "variant": variant,
                "scenarios": [{"scenario": {"model": model, "engine": "vllm"}, "workloads": summaries}]}
    # Stock: add + norm, GEMM, activation, GEMM over 2 steps; ours: add + norm, gate/up with the activation in it,
    # the down GEMM, over 4 steps.
    stock = summarize_trace([kernel("triton_red_fused_add_rms_norm_0", 0.0, 4.0), kernel("nvjet_a", 5.0, 60.0),
                             kernel("triton_poi_fused_mul_silu_1", 66.0, 2.0), kernel("nvjet_b", 70.0, 30.0)],
                            steps=2)
    ours = summarize_trace([kernel("_norm_kernel", 0.0, 8.0), kernel("_gate_up_kernel", 8.0, 200.0),
                            kernel("nvjet_b", 210.0, 120.0)], steps=4)
    (row,) = profile.compare(document("stock", {"LLM.decode_batch_32": stock, "LLM.throughput": stock}),
                             document("standardkernels adapter", {"LLM.decode_batch_32": ours}))
    assert (row["model"], row["engine"], row["workload"], row["steps"]) == ("sk-tiny/qwen3", "vllm",
                                                                             "LLM.decode_batch_32", (2, 4))
    per_step = row["per_step_us"]
    assert per_step["busy"] == (48.0, 82.0) and per_step["idle gaps"] == (2.0, 0.5)
    assert per_step["norm"] == (2.0, 2.0) and per_step["activation"] == (1.0, 0.0)
    assert per_step["gemm"] == (45.0, 80.0)  # _gate_up_kernel counts as a GEMM
    kernels = {k["name"]: (k["base_us"], k["cand_us"]) for k in row["kernels"]}
    assert kernels["nvjet_b"] == (15.0, 30.0) and kernels["nvjet_a"] == (30.0, None)
    assert kernels["_gate_up_kernel"] == (None, 50.0) and row["kernels"][0]["name"] == "_gate_up_kernel"
    console = Console(width=250, record=True)
    for table in profile.compare_tables([row], "stock", "ours"):
        console.print(table)
    text = console.export_text()
    assert "LLM.decode_batch_32" in text and "+34.0" in text and "Steps profiled: 2 and 4" in text
    with pytest.raises(WorkflowError, match="share no workload of the same model and engine"):
        profile.compare(document("stock", {"LLM.decode_batch_32": stock}),
                        document("ours", {"LLM.decode_batch_32": ours}, model="sk-tiny/llama"))


def test_a_comparison_says_whether_both_profiles_ran_on_one_card(tmp_path):
    from rich.console import Console

    from sk.workflow import profile

    summary = summarize_trace([{"ph": "X", "cat": "kernel", "name": "nvjet_a", "ts": 0.0, "dur": 10.0}], steps=1)

    def document(uuid):
        environment = {"device": "NVIDIA H100 80GB HBM3"} | ({"device_uuid": uuid} if uuid else {})
        return {"schema": profile.SCHEMA, "date": "2026-12-06T00:00:00+00:00", "variant": "stock",
                "scenarios": [{"scenario": {"model": "sk-tiny/qwen3", "engine": "vllm"}, "environment": environment,
                               "workloads": {"LLM.decode_batch_32": summary}}]}

    def notes(base, cand):
        (row,) = profile.compare(document(base), document(cand))
        console = Console(width=400, record=True)
        for table in profile.compare_tables([row], "stock", "ours"):
            console.print(table)
        return row["gpus"], " ".join(console.export_text().split())  # the caption wraps at the table's width
    gpus, text = notes("GPU-1", "GPU-1")
    assert gpus == ("GPU-1", "GPU-1") and "Both ran on one card." in text
    gpus, text = notes("GPU-1", "GPU-2")
    assert gpus == ("GPU-1", "GPU-2") and "DIFFERENT CARDS (GPU-1 and GPU-2)" in text
    gpus, text = notes(None, "GPU-2")  # a file written before the UUID was recorded
    assert gpus == (None, "GPU-2") and "not recorded" in text
    # The command line warns outside the tables too, and only for two known, different cards.
    for base, cand, warned in (("GPU-1", "GPU-2", True), ("GPU-1", "GPU-1", False), (None, "GPU-2", False)):
        paths = []
        for name, uuid in (("base", base), ("cand", cand)):
            paths.append(tmp_path / f"{name}.json")
            paths[-1].write_text(json.dumps(document(uuid)))
        console = Console(width=400, record=True)
        profile.run_compare(*map(str, paths), console)
        assert ("ran on different cards" in " ".join(console.export_text().split())) is warned


def test_the_kept_trace_holds_the_device_events_and_summarizes_the_same(tmp_path):
    trace = load_trace(TRACE)
    trace["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5.0, "pid": 1,
                                 "tid": 1, "args": {"a": "host ops stay out"}})
    kept = tmp_path / "traces" / "t.trace.json.gz"
    summary = summarize_trace(trace, steps=2, keep=kept)
    again = load_trace(kept)
    assert {e["cat"] for e in again["traceEvents"]} == {"kernel"} and not any("args" in e for e in again["traceEvents"])
    assert summarize_trace(again, steps=2) == summary == summarize_trace(trace, steps=2)


def test_the_decode_graph_of_a_batch_is_the_full_one_of_its_size():
    from collections import namedtuple
    from types import SimpleNamespace as NS

    from sk.workflow.profile_worker import decode_graphs

    Mode = namedtuple("Mode", "name")
    Desc = namedtuple("Desc", "cg_mode num_tokens num_reqs uniform_token_count num_active_loras")  # as vLLM's: hashable
    Key = namedtuple("Key", "num_tokens num_reqs uniform")

    def desc(mode, tokens, reqs, uniform, loras=0):
        return Desc(Mode(mode), tokens, reqs, uniform, loras)
    # vLLM's model runner V2: the separate decode routine's graph wins over a FULL mixed-batch graph of the size;
    # piecewise graphs, other sizes and LoRA cases are never it.
    v2 = NS(cudagraph_manager=NS(graphs={
        desc("FULL", 32, 32, 1): "decode-32", desc("FULL", 32, 32, None): "mixed-32",
        desc("PIECEWISE", 32, None, None): "piecewise-32", desc("FULL", 8, 8, 1): "decode-8",
        desc("FULL", 32, 32, 1, loras=1): "lora-32"}))
    assert decode_graphs(v2, 32) == ["decode-32"] and decode_graphs(v2, 8) == ["decode-8"]
    assert decode_graphs(v2, 1) == []
    only_mixed = NS(cudagraph_manager=NS(graphs={desc("FULL", 8, 8, None): "mixed-8"}))
    assert decode_graphs(only_mixed, 8) == ["mixed-8"]
    # V1: the CUDAGraphWrapper around the whole model (FULL), keyed by BatchDescriptor.
    entry = NS(cudagraph="graph-8")
    wrapper = NS(runtime_mode=NS(name="FULL"), concrete_cudagraph_entries={
        Key(8, 8, True): entry, Key(16, 16, True): entry, Key(8, 8, False): NS(cudagraph="mixed")})
    assert decode_graphs(NS(model=NS(cudagraph_wrapper=wrapper)), 8) == ["graph-8"]
    piecewise = NS(runtime_mode=NS(name="PIECEWISE"), concrete_cudagraph_entries={})
    assert decode_graphs(NS(model=NS(cudagraph_wrapper=piecewise)), 8) == []
    assert decode_graphs(NS(model=object()), 8) == [] and decode_graphs(None, 8) == []  # eager, the CPU engine


def test_a_comparison_shows_the_replayed_decode_graphs_and_pairs_them_round_by_round():
    from rich.console import Console

    from sk.workflow import paired, profile

    summary = summarize_trace([{"ph": "X", "cat": "kernel", "name": "nvjet_a", "ts": 0.0, "dur": 10.0}], steps=1)

    def document(variant, replay_us):
        return {"schema": profile.SCHEMA, "date": "2026-12-06T00:00:00+00:00", "variant": variant,
                "scenarios": [{"scenario": {"model": "sk-tiny/qwen3", "engine": "vllm"},
                               "workloads": {"LLM.decode_batch_32": summary | {"graph_replay_us": replay_us}}}]}
    (row,) = profile.compare(document("stock", 5400.0), document("ours", 5500.0))
    assert row["graph_replay_us"] == (5400.0, 5500.0)
    console = Console(width=300, record=True)
    for table in profile.compare_tables([row], "stock", "ours"):
        console.print(table)
    text = console.export_text()
    assert "decode graph replayed (µs, no profiler)" in text and "+100.0" in text
    (row,) = profile.compare(document("stock", None), document("ours", None))  # SGLang, or eager
    console = Console(width=300, record=True)
    for table in profile.compare_tables([row], "stock", "ours"):
        console.print(table)
    assert "decode graph replayed" not in console.export_text()

    class Engine:  # the replies of EngineProcess.call("graph_replay", ...): µs, or None without such a graph
        def __init__(self, us):
            self.us, self.calls = us, 0

        def call(self, command, description=None, **arguments):
            assert command in ("graph_replay", "graph_clocks")
            assert arguments["workload"] in ("LLM.decode_batch_32", "LLM.throughput")
            if arguments["workload"] == "LLM.throughput":
                return None
            if command == "graph_clocks":  # sk.workflow.profile_worker.clocks_under's reply
                return {"replays": 180, "samples": 95, "sm_mhz_median": 1980.0 - self.us / 100, "sm_mhz_min": 1900.0,
                        "power_w_median": 650.0, "clock_limits": ["sw_power_cap"] if self.us > 5450 else []}
            self.calls += 1
            return self.us + self.calls  # drifts: the rounds' order keeps that out of the ratio

    scenario = type("S", (), {"workloads": ["LLM.decode_batch_32", "LLM.throughput"]})()
    stock, ours = Engine(5400.0), Engine(5500.0)
    found = profile._replayed_in_pairs(stock, ours, scenario, rounds=4)
    assert list(found) == ["LLM.decode_batch_32"]  # no graph for the throughput batch: no pair
    result = found["LLM.decode_batch_32"]
    assert stock.calls == ours.calls == 5 and result["rounds"] == 4 and result["order"] == "AB BA AB BA"
    assert result["verdict"] == "candidate slower" and 0.98 < result["speedup"] < 0.983
    table = profile.replay_pairs_table([{"scenario": {"model": "sk-tiny/qwen3"},
                                         "workloads": {"LLM.decode_batch_32": {"graph_replay_paired": result}}}])
    console = Console(width=300, record=True)
    console.print(table)
    text = console.export_text()
    assert "candidate slower" in text and paired.pairing_order(1) == [("baseline", "candidate")]
    assert result["clocks"]["candidate"]["clock_limits"] == ["sw_power_cap"]
    assert profile.clocks_line(result["clocks"]) == (
        "stock: SM 1,926 MHz (lowest 1,900), 650 W, clock limits: none; ours: SM 1,925 MHz (lowest 1,900), 650 W, "
        "clock limits: sw_power_cap")
    assert "under each graph replayed for a second" in text and "sw_power_cap" in text


def test_a_trace_splits_into_engine_steps_at_the_marker_kernel():
    from sk.workflow.kernel_profile import VLLM_STEP_MARKER, step_windows

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}
    # Two steps: the first's kernels 10 + 30 µs (the GEMM overlapping the marker by 5 counts once) in a 100 µs
    # window that ends where the second's marker begins; the second ends with its last kernel.
    trace = {"traceEvents": [
        kernel("before_the_first_step", 0.0, 5.0), kernel(VLLM_STEP_MARKER, 10.0, 10.0), kernel("nvjet_a", 15.0, 35.0),
        kernel(VLLM_STEP_MARKER + "_v2", 110.0, 10.0), kernel("nvjet_a", 130.0, 30.0),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 500.0}]}
    assert step_windows(trace) == [{"window_us": 100.0, "busy_us": 40.0, "kernels": 2},
                                   {"window_us": 50.0, "busy_us": 40.0, "kernels": 2}]
    assert step_windows(trace, marker="no_such_kernel") == []


def test_the_host_side_of_a_profiled_batch_records_steps_collector_pauses_and_report_writes():
    import gc
    import time

    from rich.console import Console

    from sk.workflow import profile
    from sk.workflow.profile_worker import HostTimes

    writes = [(time.perf_counter() - 60.0, 0.5)]  # a report write before the batch: not its
    counters = iter([{"num_device_alloc": 10, "num_device_free": 2, "num_alloc_retries": 0},
                     {"num_device_alloc": 13, "num_device_free": 3, "num_alloc_retries": 1}])
    host = HostTimes(memory_stats=lambda: next(counters)).start()  # torch.cuda.memory_stats' keys
    host.step(0.012)
    host.step(0.003)
    host.step(0.004)
    gc.collect()  # a full collection: one pause of generation 2
    writes.append((time.perf_counter(), 0.002))  # sk.reports.write_intervals()' record (tests/test_reports.py)
    host.stop()
    gc.collect()  # after stop: not counted
    summary = host.summary(writes)
    assert summary["step_ms"] == [12.0, 3.0, 4.0] and summary["median_step_ms"] == 4.0
    gc_side = summary["gc"]  # the explicit full collection; an automatic young one may come too
    assert gc_side["generations"].get("2") == 1 and gc_side["count"] == sum(gc_side["generations"].values())
    assert gc_side["max_ms"] > 0 and gc_side["total_ms"] >= gc_side["max_ms"]
    assert summary["report_writes"] == {"count": 1, "total_ms": 2.0, "max_ms": 2.0}
    assert 0 < summary["window_ms"] < 6e4 and gc.callbacks.count(host._on_gc) == 0
    assert summary["allocator"] == {"device_allocs": 3, "device_frees": 1, "alloc_retries": 1,
                                    "syncs_all_streams": 0}
    assert "first step 12.00 ms, median 4.00 ms, slowest 12.00 ms" in profile.host_line(summary)
    assert "CUDA allocator: 3 cudaMalloc, 1 cudaFree, 1 retries" in profile.host_line(summary)
    if not torch.cuda.is_available():  # no CUDA: not measured, rather than zero
        bare = HostTimes().start()
        bare.stop()
        assert bare.summary([])["allocator"] is None

    base = summarize_trace([{"ph": "X", "cat": "kernel", "name": "nvjet_a", "ts": 0.0, "dur": 10.0}], steps=3)

    def document(variant, host_side):
        workload = base | ({"host": host_side} if host_side else {})
        return {"schema": profile.SCHEMA, "date": "2026-12-07T00:00:00+00:00", "variant": variant,
                "scenarios": [{"scenario": {"model": "sk-tiny/qwen3", "engine": "vllm"},
                               "workloads": {"LLM.decode_batch_32": workload}}]}
    slower = summary | {"step_ms": [19.5, 3.0, 4.0]}
    (row,) = profile.compare(document("stock", summary), document("ours", slower))
    assert row["host_ms"]["host: first step in execute_model (ms)"] == (12.0, 19.5)
    console = Console(width=300, record=True)
    for table in profile.compare_tables([row], "stock", "ours"):
        console.print(table)
    assert "+7.50 ms" in console.export_text()
    (row,) = profile.compare(document("stock", None), document("ours", None))  # SGLang's profiles, older files
    assert set(row["host_ms"].values()) == {(None, None)}
    console = Console(width=300, record=True)
    for table in profile.compare_tables([row], "stock", "ours"):
        console.print(table)
    assert "host:" not in console.export_text()
