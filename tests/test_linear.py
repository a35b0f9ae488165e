"""sk.ops.linear: the split-K kernel against fp64 math (Triton's interpreter on CPU in fp32/fp16; bf16 on the GPU,
at the engines' QKV and output-projection shapes), K splits summed in a fixed order and the persistent split-K
counters left zeroed by every call (so that the next call, or a graph replay, finds them so); the routes (cuBLAS
by default; with backend="split_k" the kernel up to 32 rows, cuBLAS above; with backend="auto" the kernel where a
tuned entry measured it faster; the recorded reference outside coverage); the custom op (fake, torch.compile
fullgraph, autograd through the reference); argument errors.

Tolerances: relative norm error against the fp64 reference on the same (rounded) inputs and weights; the
products are accumulated in fp32 and the output rounded once.
  fp32: far under 1e-5.  fp16: one rounding, u = 4.9e-4: 2e-3 = 4u.
  bf16 (GPU): 1e-2, and no worse than 1.25x cuBLAS's own bf16 error + 1e-3.
"""
import dataclasses
import functools

import pytest
import torch

import sk
from numerics import KERNEL_DEVICE, rel_err
from sk.ops.gated_mlp import linear_reference, triton_kernels as tk
from sk.ops.gated_mlp.common import cdiv

INTERPRETED_CPU = KERNEL_DEVICE == "cpu" and sk.settings.get("triton_interpret")
needs_interpreter = pytest.mark.skipif(not INTERPRETED_CPU, reason="needs TRITON_INTERPRET=1 on a CPU-only machine")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# Small tiles, so that the interpreter runs several tiles and K splits on small problems.
SMALL = tk.GemmConfig(16, 16, 32, 4, 2, split_k=0, swap_ab=True)


split_k = functools.partial(sk.ops.linear, backend="split_k")  # the kernel (the op's default is cuBLAS)


def make(m, n, k, dtype, device=KERNEL_DEVICE, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, dtype)
    b = (0.1 * torch.randn(n, generator=gen)).to(device, dtype) if bias else None
    return x, w, b


def fp64(x, w, b):
    return linear_reference(x.double(), w.double(), None if b is None else b.double())


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every floating buffer the op allocates starts as NaN, so an element a kernel fails to write shows up."""
    allocate = torch.empty

    def poisoned(*args, **kwargs):
        t = allocate(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", poisoned)


# ----------------------------------------------------------------------------------------------- interpreter (CPU)

@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1, 8, 8), (3, 40, 96), (17, 200, 256), (32, 64, 1024)])
@pytest.mark.parametrize("split", [1, 2, 3, 0])
@pytest.mark.parametrize("bias", [True, False])
def test_interpreted_kernel_matches_fp64_and_leaves_the_counters_zeroed(dtype, m, n, k, split, bias,
                                                                          poisoned_outputs):
    x, w, b = make(m, n, k, dtype, bias=bias, seed=m + n)
    config = tk.fit_split(dataclasses.replace(SMALL, split_k=split), m, n, k, 4)
    first = tk.linear_kernels(x, w, b, config)
    again = tk.linear_kernels(x, w, b, config)  # the persistent counters again, as the first call left them
    assert rel_err(first, fp64(x, w, b)) < TOL[dtype]
    assert torch.equal(first, again)  # the K splits are summed in a fixed order
    counters = tk.linear_counters(torch.device("cpu"))
    assert counters is None or not counters.any()


def test_captured_calls_take_split_counters_of_their_own(monkeypatch):
    """Eager calls on a stream share that stream's persistent counters; each call captured into a CUDA graph
    gets a zeroed slice of the device's capture block that no other call (captured or eager) reads, so graphs
    replayed at once never count into one counter; past the block, counters of its own (zeroed in the graph)."""
    device = torch.device("cpu")
    eager = tk.split_counters(device, 10, captured=False)
    assert eager is tk.linear_counters(device) and tk.split_counters(device, 40, captured=False) is eager
    block, used = tk.capture_counters(device)
    first, second = (tk.split_counters(device, tiles, captured=True) for tiles in (10, 20))
    start = block.data_ptr() + 4 * used
    assert (first.data_ptr(), first.numel()) == (start, 10)
    assert (second.data_ptr(), second.numel()) == (start + 40, 20)
    assert not first.any() and not second.any() and tk.capture_counters(device)[1] == used + 30
    monkeypatch.setattr(tk, "CAPTURE_COUNTERS", used + 35)
    past = tk.split_counters(device, 10, captured=True)
    assert past.numel() == 10 and not past.any()
    assert not block.data_ptr() <= past.data_ptr() < block.data_ptr() + 4 * block.numel()
    assert past.data_ptr() != eager.data_ptr()
    too_many = tk.split_counters(device, tk.LINEAR_COUNTERS + 1, captured=False)
    assert too_many.numel() == tk.LINEAR_COUNTERS + 1 and too_many.data_ptr() != eager.data_ptr()


@needs_interpreter
def test_interpreted_op_routes_by_rows(monkeypatch):
    """Up to LINEAR_MAX_M rows the split-K kernel, above it cuBLAS (torch's linear); both counted as our op's
    kernel calls (no fallback), with the same numbers."""
    launched = []
    kernels = tk.linear_kernels
    monkeypatch.setattr(tk, "linear_kernels", lambda *a, **k: launched.append(a[0].shape[0]) or kernels(*a, **k))
    sk.coverage.reset()
    for m in (1, 32, 33, 100):
        x, w, b = make(m, 48, 64, torch.float16, seed=m)
        with torch.no_grad(), sk.coverage.strict():
            got = split_k(x, w, b)
        assert rel_err(got, fp64(x, w, b)) < TOL[torch.float16]
    assert launched == [1, 32]
    assert sk.coverage.report()["kernel_calls"]["linear"] == 4


@needs_interpreter
def test_interpreted_auto_backend_runs_the_kernel_only_where_a_tuned_entry_measured_it_faster(monkeypatch):
    """backend="auto": the split-K kernel for the rows' class and weight shapes `LINEAR_TUNED` names (here a
    small entry standing in for Llama-3-8B's), cuBLAS at other shapes and at other row classes of the same
    weight; both counted as our op's calls, the same numbers."""
    launched = []
    kernels = tk.linear_kernels
    monkeypatch.setattr(tk, "linear_kernels", lambda *a, **k: launched.append(tuple(a[1].shape)) or kernels(*a, **k))
    monkeypatch.setitem(tk.LINEAR_TUNED, ("m8", 48, 64), SMALL)
    assert tk.linear_config(3, 48, 64, 132).block_n == SMALL.block_n  # the tuned entry's tiles
    sk.coverage.reset()
    for m, n in ((3, 48), (8, 48), (9, 48), (3, 40)):
        x, w, b = make(m, n, 64, torch.float16, seed=m + n)
        with torch.no_grad(), sk.coverage.strict():
            got = sk.ops.linear(x, w, b, backend="auto")
        assert rel_err(got, fp64(x, w, b)) < TOL[torch.float16], (m, n)
    assert launched == [(48, 64), (48, 64)]  # 9 rows is class m32: no entry; [40, 64]: none
    assert sk.coverage.report()["kernel_calls"]["linear"] == 4


def test_every_tuned_linear_entry_names_its_committed_sweep():
    import pathlib

    root = pathlib.Path(__file__).parents[1]
    assert tk.LINEAR_TUNED and tk.linear_tuned(1, 6144, 4096) and not tk.linear_tuned(32, 6144, 4096)
    for key, c in tk.LINEAR_TUNED.items():
        assert c.source != "untuned" and (root / c.source).is_file(), key


@needs_interpreter
def test_the_default_backend_is_cublas_and_launches_no_kernel_of_ours(monkeypatch):
    """cuBLAS (torch's linear) by default, measured faster than the split-K kernel at most projection shapes on
    the H200: counted as our op's call (no fallback), the same numbers."""
    launched = []
    monkeypatch.setattr(tk, "linear_kernels", lambda *a, **k: launched.append(a[0].shape[0]))
    sk.coverage.reset()
    x, w, b = make(4, 48, 64, torch.float16, seed=4)
    with torch.no_grad(), sk.coverage.strict():
        got = sk.ops.linear(x, w, b)
    assert launched == [] and rel_err(got, fp64(x, w, b)) < TOL[torch.float16]
    assert sk.coverage.report()["kernel_calls"]["linear"] == 1


def test_an_unknown_backend_is_a_clear_error():
    x, w, b = make(2, 8, 16, torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"backend must be one of \('cublas', 'split_k', 'auto'\); got 'triton'"):
        sk.ops.linear(x, w, b, backend="triton")


@needs_interpreter
def test_interpreted_leading_dims_non_contiguous_x_and_empty_batches():
    x, w, b = make(12, 24, 32, torch.float16)
    x3 = x.view(3, 4, 32).transpose(0, 1)  # non-contiguous, leading dims (4, 3)
    got = split_k(x3, w, b)
    assert got.shape == (4, 3, 24) and rel_err(got, fp64(x3, w, b)) < TOL[torch.float16]
    empty = split_k(x[:0], w, b)
    assert empty.shape == (0, 24)


@needs_interpreter
def test_a_weight_in_another_dtype_is_cast_once():
    x, w, b = make(4, 24, 32, torch.float16)
    master = w.float()  # an FP32 master with fp16 activations
    sk.coverage.reset()
    for _ in range(3):
        got = split_k(x, master, b)
    assert torch.equal(got, split_k(x, w, b))
    assert sk.coverage.report()["weights_prepared"]["linear"] == 1


@needs_interpreter
def test_interpreted_compiled_and_eager_paths_agree():
    """torch.compile(fullgraph=True) traces the custom op (its fake gives the shape) and runs the same kernel."""
    x, w, b = make(5, 24, 32, torch.float16)
    compiled = torch.compile(split_k, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, w, b), split_k(x, w, b))


def test_fp32_takes_the_recorded_fallback_and_trains():
    x, w, b = make(3, 16, 24, torch.float32, device="cpu")
    x.requires_grad_(True)
    sk.coverage.reset()
    out = sk.ops.linear(x, w, b)
    out.sum().backward()
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(x.grad, w.sum(0).expand(3, -1))
    reasons = {f["reason"] for f in sk.coverage.report()["fallbacks"] if f["op"] == "linear"}
    assert any("dtype fp32" in r or "CPU tensor" in r for r in reasons), reasons
    assert any(r.startswith("backward: ") for r in reasons), reasons


def test_strict_mode_raises_on_a_fallback_and_widths_not_multiples_of_8_fall_back():
    x, w, b = make(3, 16, 24, torch.float32, device="cpu")
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match=r"sk\.ops\.linear"):
        sk.ops.linear(x, w, b)
    x, w, b = make(3, 12, 20, torch.float16, device=KERNEL_DEVICE)
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="multiples of 8"):
        sk.ops.linear(x, w, b)


def test_custom_op_registration_passes_opcheck():
    x, w, b = make(5, 16, 24, torch.float64, device="cpu")
    for bias in (b, None):
        torch.library.opcheck(torch.ops.sk.linear.default, (x, w, bias, "split_k"),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("args,match", [
    (dict(x=None), "x is required"),
    (dict(weight=torch.zeros(8, 7)), r"weight must be \(N, K\) with K = x's last dim 16"),
    (dict(weight=torch.zeros(16)), r"weight must be \(N, K\)"),
    (dict(bias=torch.zeros(9)), r"bias must be \(N,\) = \(8,\)"),
    (dict(x=torch.zeros(2, 16, dtype=torch.int32)), "x has dtype torch.int32"),
    (dict(weight=torch.zeros(8, 16, device="meta")), "all tensors must be on one device"),
])
def test_argument_errors_are_clear(args, match):
    call = dict(x=torch.zeros(2, 16), weight=torch.zeros(8, 16), bias=torch.zeros(8)) | args
    with pytest.raises((ValueError, TypeError), match=match):
        sk.ops.linear(**call)


def test_decode_configs_split_k_to_fill_the_gpu():
    # The engines' projections at decode sizes on the H200's 132 SMs: the tuned entry or the down kernel's decode
    # class, K split until the tiles make its waves (within the rounding to equal splits), or K runs out of splits.
    for m in (1, 8, 32):
        for n, k in ((6144, 4096), (4096, 4096), (3072, 2048), (2048, 2048)):
            c = tk.linear_config(m, n, k, 132)
            tiles, k_blocks = -(-n // c.block_n), k // c.block_k
            entry = tk.LINEAR_TUNED.get((tk.shape_class(m), n, k)) or tk.DOWN_CONFIGS[tk.shape_class(m)]
            want = int(entry.split_waves * 132)
            assert c.swap_ab and c.block_m == max(16, m) and -(-k_blocks // c.split_k) >= 2  # 2+ K blocks a split
            assert tiles * c.split_k >= 0.75 * want or c.split_k in (tk.MAX_SPLIT_K, k_blocks // 2), (m, n, k, c)


# ----------------------------------------------------------------------------------------------- GPU (bf16)

# Llama-3-8B's QKV (4096 -> 6144) and output projection (4096 -> 4096), Llama-3.2-1B's QKV (2048 -> 3072),
# a tp=2 shard, and rows on both sides of the kernel's limit.
GPU_SHAPES = [(1, 6144, 4096), (8, 4096, 4096), (32, 3072, 2048), (3, 3072, 4096), (33, 6144, 4096),
              (512, 4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_bf16_matches_fp64_and_cublas(m, n, k):
    x, w, b = make(m, n, k, torch.bfloat16, device="cuda", seed=m)
    with torch.no_grad(), sk.coverage.strict():
        out = split_k(x, w, b)
    want = fp64(x, w, b)
    ours, theirs = rel_err(out, want), rel_err(torch.nn.functional.linear(x, w, b), want)
    assert ours < TOL[torch.bfloat16] and ours <= 1.25 * theirs + 1e-3, (ours, theirs)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (32, 4096, 4096)])
@pytest.mark.parametrize("warmed_on_the_capture_stream", [True, False])
def test_gpu_graph_replay_with_fresh_inputs(m, n, k, warmed_on_the_capture_stream):
    """Replays of a captured call onto fresh inputs and poisoned outputs give the eager call's bits, whether or
    not the capture's stream ran the op before (as vLLM and SGLang do): the captured call counts into a slice of
    the device's capture block, which every replay leaves zeroed, not into a stream's persistent counters."""
    x, w, b = make(m, n, k, torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        split_k(x, w, b)  # compiles the kernel and zeroes the counters (on the default stream)
        with torch.cuda.stream(stream):
            if warmed_on_the_capture_stream:
                split_k(x, w, b)
            block, before = tk.capture_counters(x.device)
            with torch.cuda.graph(graph, stream=stream):
                out = split_k(x, w, b)
        c = tk.linear_config(m, n, k, torch.cuda.get_device_properties(x.device).multi_processor_count)
        tiles = cdiv(m, c.block_m) * cdiv(n, c.block_n)
        assert tk.capture_counters(x.device)[1] == before + (tiles if c.split_k > 1 else 0)
        for seed in range(3):
            x.copy_(make(m, n, k, torch.bfloat16, device="cuda", seed=10 + seed)[0])
            want = split_k(x, w, b)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)
        assert not block.any()


@pytest.mark.gpu
def test_gpu_graphs_captured_on_one_stream_replay_concurrently():
    """Two graphs captured on one stream (warmed up there, as the engines do), replayed at the same time on two
    streams, many times, onto fresh inputs: each replay gives its eager call's bits (they counted into counters
    of their own; with shared ones the two kernels' arrivals mix and a tile sums too early or never)."""
    m, n, k = 8, 6144, 4096
    capture = torch.cuda.Stream()
    graphs, inputs, outputs = [torch.cuda.CUDAGraph() for _ in range(2)], [], []
    with torch.no_grad(), torch.cuda.stream(capture):
        for i, graph in enumerate(graphs):
            x, w, b = make(m, n, k, torch.bfloat16, device="cuda", seed=i)
            split_k(x, w, b)
            with torch.cuda.graph(graph, stream=capture):
                outputs.append(split_k(x, w, b))
            inputs.append((x, w, b))
    streams = [torch.cuda.Stream() for _ in graphs]
    with torch.no_grad():
        for seed in range(20):
            for i, (x, w, b) in enumerate(inputs):
                x.copy_(make(m, n, k, torch.bfloat16, device="cuda", seed=100 * i + seed)[0])
            wants = [split_k(x, w, b) for x, w, b in inputs]
            for out in outputs:
                out.fill_(float("nan"))
            torch.cuda.synchronize()
            for _ in range(4):  # back-to-back replays on both streams, overlapping one another
                for graph, stream in zip(graphs, streams):
                    with torch.cuda.stream(stream):
                        graph.replay()
            torch.cuda.synchronize()
            for out, want in zip(outputs, wants):
                assert torch.equal(out, want)
    assert not tk.linear_counters(torch.device("cuda", torch.cuda.current_device())).any()


# ------------------------------------------------------------------------------------ compiled for sm90 (any machine)

_COMPILE_CHECK = r"""
import json, re, sys
sys.path.insert(0, "benchmarks")
from compile_report_gated_mlp import compile_kernel, tk
found = {}
for m, n, k in ((1, 6144, 4096), (8, 4096, 4096), (32, 3072, 2048)):
    c = tk.linear_config(m, n, k, 132)
    kernel = compile_kernel("down", c, n, k, linear=True)
    found[f"{m}x{n}x{k}"] = {"stages": c.num_stages, "split": c.split_k, "wgmma": "wgmma" in kernel.asm["ptx"],
                             "buffers": [int(b) for b in re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x",
                                                                     kernel.asm["ttgir"])]}
print(json.dumps(found))
"""


def test_linear_configs_compile_for_sm90_on_wgmma_with_every_operand_fully_buffered():
    """The split-K kernel as sk.ops.linear launches it, compiled for sm90 (Triton's own ptxas, no GPU) at the
    attention projections' decode configs: both operand tiles num_stages deep, the products on wgmma, K split."""
    from sm90_compile import run_compile_check

    for shape, r in run_compile_check(_COMPILE_CHECK).items():
        assert r["wgmma"] and r["buffers"] == [r["stages"]] * 2 and r["split"] > 1, (shape, r)


def test_autocast_leaves_a_half_precision_x_in_its_dtype_on_both_backends():
    w = torch.randn(24, 64, dtype=torch.float16) / 8
    x = torch.randn(3, 64, dtype=torch.float16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = [sk.ops.linear(x, w, backend=b) for b in ("cublas", "split_k")]
    assert [o.dtype for o in outs] == [torch.float16, torch.float16]
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-3, atol=2e-3)
