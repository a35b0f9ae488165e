"""fused_pre_norm_geglu's GEMMs through QuACK's CuTe-DSL kernels (sk_core/ops/gated_mlp/quack_gemms.py, admitted
by sk_core/ops/gated_mlp/quack_backend.py): on an SM90 GPU with QuACK installed (ci/gpu/cute.sh), inference on
folded weights in the seed and prefill classes must run them, match fp64 math at odd shapes, dtypes, both GELUs
and without biases, and replay from a CUDA graph; everywhere else, and with a QuACK of another version or
structure (said once, in a warning naming it), the Triton GEMMs run."""
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import sk
from numerics import rel_err
from test_fused_pre_norm_geglu import EPS, TOL, eager_bf16, fp64_block, make_params, make_x, poison_allocator

geglu = importlib.import_module("sk.ops.gated_mlp.geglu")
gk = importlib.import_module("sk.ops.gated_mlp.geglu_kernels")
quack_backend = importlib.import_module("sk.ops.gated_mlp.quack_backend")
CUTE = quack_backend.available(torch.device("cuda")) if torch.cuda.is_available() else None
needs_cute = pytest.mark.skipif(CUTE is None, reason="needs an SM90 GPU with QuACK installed (ci/gpu/cute.sh)")


def test_cpu_tensors_never_take_the_cute_gemms():
    assert quack_backend.available(torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)
                    or importlib.util.find_spec("quack") is None, reason="needs an SM90 GPU with QuACK installed")
def test_gpu_the_pinned_quack_is_admitted():
    """Where QuACK is installed as pinned (ci/gpu/cute.sh), the version and structure check admits it: the tests
    of this file then run rather than skip."""
    assert CUTE is not None, quack_backend.status()
    assert quack_backend.status().startswith(f"QuACK {quack_backend.SUPPORTED_QUACK[0]}:"), quack_backend.status()


def _fake_quack(monkeypatch, version):
    import importlib.machinery
    import types

    fake = types.ModuleType("quack")
    fake.__version__, fake.__spec__ = version, importlib.machinery.ModuleSpec("quack", None)
    monkeypatch.setitem(sys.modules, "quack", fake)
    for name in [n for n in sys.modules if n.startswith("quack.")]:  # the real QuACK's, where it is installed
        monkeypatch.delitem(sys.modules, name)


def test_an_unknown_quack_version_runs_the_triton_gemms_and_says_so(monkeypatch):
    _fake_quack(monkeypatch, "0.7.0")
    with pytest.warns(RuntimeWarning, match=r"QuACK 0\.7\.0 not used, running the Triton GEMMs.*0\.6\.5"):
        module, status = quack_backend.check_installed()
    assert module is None and "0.7.0" in status


def test_a_quack_missing_the_internals_we_use_runs_the_triton_gemms_and_says_so(monkeypatch):
    _fake_quack(monkeypatch, quack_backend.SUPPORTED_QUACK[0])
    with pytest.warns(RuntimeWarning, match=r"not used, running the Triton GEMMs: .*quack\.epilogue\.frontend"):
        module, status = quack_backend.check_installed()
    assert module is None and "quack.gemm_interface" in status


def test_no_quack_installed_is_said_without_a_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "quack", None)  # find_spec: as if not installed
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module, status = quack_backend.check_installed()
    assert module is None and "not installed" in status


@pytest.mark.gpu
@needs_cute
def test_gpu_quack_is_patched_only_while_our_gemms_trace(tmp_path):
    """Tracing a row-statistics gate/up GEMM (compiled afresh) wraps `cute.arch.setmaxregister_decrease` for the
    trace only: before and after, every other QuACK or CuTe-DSL kernel sees the DSL's own function."""
    row_stats = 'row_stats=(CUTE.row_stats_counters(x.device), 1e-5))'
    code = _GATE_UP_PTX.replace('"none", "small")', f'"none", "small", {row_stats}')
    code = ("import cutlass.cute as cute\nbefore = cute.arch.setmaxregister_decrease\n" + code
            + "assert cute.arch.setmaxregister_decrease is before, cute.arch.setmaxregister_decrease\n")
    env = dict(os.environ, QUACK_CACHE_ENABLED="0")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)


@pytest.fixture
def cute_calls(monkeypatch):
    """The CuTe-DSL launches made, by name, so that a test knows which GEMMs ran."""
    calls = []
    for name in ("gate_up", "down"):
        launch = getattr(CUTE, name)
        monkeypatch.setattr(CUTE, name,
                            lambda *a, launch=launch, name=name, **k: (calls.append(name), launch(*a, **k))[1])
    return calls


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("m,d,ff,dtype,approximate,bias", [
    (1024, 768, 1448, torch.bfloat16, "none", True),    # the seed shape
    (1000, 768, 1448, torch.bfloat16, "tanh", True),    # partial row tiles
    (4097, 768, 1448, torch.bfloat16, "none", False),   # M odd: statistics rows not 16-byte multiples
    (65, 200, 520, torch.bfloat16, "none", True),       # one row past decode; d_ff not a multiple of 16
    (80, 64, 40, torch.float16, "tanh", True),          # M == 2·d_ff (row and column vectors alike long)
    (100, 40, 24, torch.float16, "none", False),        # d_model and d_ff below one tile
    (333, 1000, 3000, torch.float16, "none", True),
    (8192, 2048, 16384, torch.bfloat16, "none", True),  # the prefill shape
])
def test_gpu_cute_gemms_match_fp64(m, d, ff, dtype, approximate, bias, cute_calls):
    params = make_params(d, ff, device="cuda", bias=bias, seed=m + d + ff)
    x = make_x(m, d, dtype, "cuda", seed=m)
    poison_allocator((m, d), (m, ff))
    with torch.no_grad(), sk.coverage.strict():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS, approximate)
    assert cute_calls == ["gate_up", "down"]
    assert not y.isnan().any()
    # Rows are independent: the fp64 oracle on rows spread over M and the last 128 (the last row tiles, clusters
    # and swizzle groups) keeps prefill quick.
    rows = torch.cat([torch.linspace(0, m - 1, min(m, 1024)).long(), torch.arange(max(0, m - 128), m)]).unique()
    want = fp64_block(x[rows], *params, approximate=approximate)
    err = rel_err(y[rows], want)
    assert err < TOL[dtype], err
    if dtype == torch.bfloat16:
        eager_err = rel_err(eager_bf16(x[rows], *params, approximate=approximate), want)
        assert err <= 2 * eager_err + 1e-3, (err, eager_err)


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("m,d,ff", [(32, 2048, 16384), (7, 768, 1448)])
def test_gpu_decode_keeps_the_triton_gemms(m, d, ff, cute_calls):
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        sk.ops.fused_pre_norm_geglu(make_x(m, d, torch.bfloat16, "cuda"), *params, EPS)
    assert cute_calls == []


@pytest.mark.gpu
@needs_cute
def test_gpu_tables_cover_the_same_classes():
    assert CUTE.GATE_UP_CONFIGS.keys() == CUTE.DOWN_CONFIGS.keys()


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("m,d,one_wave", [(1024, 768, True), (1000, 768, True), (65, 200, True),
                                          (4097, 768, False), (1024, 4096, False)])
def test_gpu_small_down_takes_clusters_of_four_only_where_they_all_fit_at_once(m, d, one_wave):
    """At the seed (24 clusters of 1 × 4 CTAs; 30 fit on the H200) the down GEMM runs `DOWN_IN_ONE_WAVE`; with
    more clusters than fit (99, 128), some CTAs would run a second round of tiles, so the table's config runs.
    test_gpu_cute_gemms_match_fp64 checks both configs' results."""
    for device in (torch.device("cuda", torch.cuda.current_device()), torch.device("cuda")):  # with and without
        config = CUTE.down_config(m, d, "small", device)                                    # an index
        assert config is (CUTE.DOWN_IN_ONE_WAVE if one_wave else CUTE.DOWN_CONFIGS["small"])
        assert CUTE.down_config(8192, 2048, "large", device) is CUTE.DOWN_CONFIGS["large"]


@pytest.fixture
def stats_kernel_launches(monkeypatch):
    """How many times the statistics kernel was launched."""
    launches, kernel = [], gk.ln_stats_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]
    monkeypatch.setattr(gk, "ln_stats_kernel", Counted())
    return launches


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("m,d,ff,in_gate_up", [
    (1024, 768, 1448, True),     # the seed: 128 CTAs in one wave, 3 rows per statistics warp
    (332, 1000, 3000, True),
    (68, 200, 520, True),
    (65, 200, 520, False),       # M not a multiple of 4: 1/std's row would not start on 16 bytes
    (2048, 768, 1448, False),    # 128 clusters of two CTAs: more than fit at once (66 on the H200)
    (4097, 768, 1448, False),
    (8192, 2048, 16384, False),  # the large class
])
def test_gpu_gate_up_computes_the_statistics_where_its_tiles_fit_in_one_wave(m, d, ff, in_gate_up,
                                                                             stats_kernel_launches):
    """Where gate/up's CTAs all fit at once, its idle warps compute the statistics and the statistics kernel does
    not run; the statistics match fp64's, and the counters are zero again after the call (so that the next one
    counts from zero), whatever the grid."""
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16, seed=m)
    x = make_x(m, d, torch.bfloat16, "cuda", seed=m) + 3.0  # a mean away from 0: the shifted sums' case
    assert CUTE.computes_row_stats(m, d, ff, gk.shape_class(m, d, ff), x.device) == in_gate_up
    folded, fold = geglu.fold_gate_up(*params[:6], torch.bfloat16)
    poison_allocator((4, m))  # the size of the fp32 statistics
    with torch.no_grad():
        y, stats, _, _ = gk.forward_kernels(x, *params[:2], folded, params[3], None, *params[5:], EPS, "none",
                                                False, fold=fold)
    torch.cuda.synchronize()
    assert len(stats_kernel_launches) == (0 if in_gate_up else 1)
    x64 = x.double()
    mean, var = x64.mean(dim=1), x64.var(dim=1, unbiased=False)
    # fp32 sums of bf16 inputs over d ≤ 2048 elements: relative errors ~1e-6; 1e-5 leaves room for the order.
    assert rel_err(stats[0], mean) < 1e-5 and rel_err(stats[1], (var + EPS).rsqrt()) < 1e-5
    assert rel_err(y, fp64_block(x, *params)) < TOL[torch.bfloat16]
    assert CUTE.row_stats_counters(x.device).tolist() == [0, 0]


@pytest.mark.gpu
@needs_cute
def test_gpu_statistics_in_gate_up_outlast_a_count_that_never_completes(stats_kernel_launches):
    """Where the count of statistics warps cannot complete (here a counter that starts far from zero; in use, a
    grid that cannot become resident at once), each CTA stops waiting after `MAX_POLLS` and computes every row's
    statistics itself: the same output, and the counters zero again after the call."""
    m, d, ff = 1024, 768, 1448
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    x = make_x(m, d, torch.bfloat16, "cuda")
    with torch.no_grad():
        want = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
        counters = CUTE.row_stats_counters(x.device)
        counters[0] = -(1 << 20)
        got = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    torch.cuda.synchronize()
    assert stats_kernel_launches == []
    assert torch.equal(got, want)
    assert counters.tolist() == [0, 0]


@pytest.mark.gpu
@needs_cute
def test_gpu_captured_calls_count_on_pairs_of_their_own():
    """Each call captured into a CUDA graph takes a pair of counters no other graph or stream uses, so that graphs
    replayed at once never share one."""
    device = torch.device("cuda", torch.cuda.current_device())
    eager = CUTE.row_stats_counters(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = [CUTE.row_stats_counters(device) for _ in range(2)]
    pointers = {t.data_ptr() for t in [eager, *captured]}
    assert len(pointers) == 3 and eager is CUTE.row_stats_counters(device)


@pytest.mark.gpu
@needs_cute
def test_gpu_statistics_in_gate_up_across_calls_grids_and_streams(stats_kernel_launches):
    """Calls of different grids back to back on one stream, with no synchronization between them, each count
    from zero; calls on a second stream, running at the same time, count on a pair of counters of their own (and
    where the two grids keep each other from being resident at once, wait no longer than `MAX_POLLS`)."""
    shapes = [(1024, 768, 1448), (68, 200, 520), (332, 1000, 3000), (1000, 768, 1448)]
    problems = [(make_params(d, ff, device="cuda", dtype=torch.bfloat16, seed=m),
                 make_x(m, d, torch.bfloat16, "cuda", seed=m)) for m, d, ff in shapes]
    device = problems[0][1].device
    other = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.no_grad():
        outputs, others = [], []
        for _ in range(3):
            for params, x in problems:
                poison_allocator((4, x.shape[0]))
                outputs.append(sk.ops.fused_pre_norm_geglu(x, *params, EPS))
                with torch.cuda.stream(other):
                    others.append(sk.ops.fused_pre_norm_geglu(x, *params, EPS))
        with torch.cuda.stream(other):
            other_counters = CUTE.row_stats_counters(device)
    torch.cuda.synchronize()
    assert stats_kernel_launches == []
    assert other_counters.data_ptr() != CUTE.row_stats_counters(device).data_ptr()
    assert other_counters.tolist() == CUTE.row_stats_counters(device).tolist() == [0, 0]
    for (params, x), y, y_other in zip(problems * 3, outputs, others):
        want = fp64_block(x, *params)
        assert rel_err(y, want) < TOL[torch.bfloat16] and rel_err(y_other, want) < TOL[torch.bfloat16]


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("switch", ["geglu_cute", "geglu_fold_ln"])
def test_gpu_switches_keep_the_triton_gemms(switch, cute_calls, settings_override):
    """SK_GEGLU_CUTE=0, and inference without the fold (SK_GEGLU_FOLD_LN=0, inference-mode weights, traced
    calls), run the Triton GEMMs; so do explicit configs (the benchmark's sweeps)."""
    m, d, ff = 1024, 768, 1448
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    x = make_x(m, d, torch.bfloat16, "cuda")
    settings_override(**{switch: False})
    with torch.no_grad():
        y = sk.ops.fused_pre_norm_geglu(x, *params, EPS)
    assert cute_calls == []
    assert rel_err(y, fp64_block(x, *params)) < TOL[torch.bfloat16]
    folded, fold = geglu.fold_gate_up(*params[:6], torch.bfloat16)
    gk.forward_kernels(x, *params[:2], folded, params[3], None, *params[5:], EPS, "none", False,
                           gk.choose_configs(m, d, ff), fold=fold)
    assert cute_calls == []


@pytest.mark.gpu
@needs_cute
def test_gpu_training_keeps_the_triton_gemms(cute_calls):
    params = [p.requires_grad_() for p in make_params(768, 1448, device="cuda")]
    x = make_x(1024, 768, torch.bfloat16, "cuda")
    sk.ops.fused_pre_norm_geglu(x, *params, EPS).sum().backward()
    assert cute_calls == [] and params[2].grad is not None


@pytest.mark.gpu
@needs_cute
@pytest.mark.parametrize("m,d,ff", [(1024, 768, 1448), (8192, 2048, 16384)])
def test_gpu_cute_gemms_replay_from_a_cuda_graph(m, d, ff, cute_calls):
    """Captured once, replayed on new inputs copied into the static one: the eager call's bits each time."""
    params = make_params(d, ff, device="cuda", dtype=torch.bfloat16)
    static_x = make_x(m, d, torch.bfloat16, "cuda")
    with torch.no_grad():
        sk.ops.fused_pre_norm_geglu(static_x, *params, EPS)  # compiles and caches the folded weights
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = sk.ops.fused_pre_norm_geglu(static_x, *params, EPS)
        for seed in (2, 3):
            x = make_x(m, d, torch.bfloat16, "cuda", seed=seed)
            static_x.copy_(x)
            static_y.fill_(float("nan"))
            graph.replay()
            assert torch.equal(static_y, sk.ops.fused_pre_norm_geglu(x, *params, EPS))
    assert set(cute_calls) == {"gate_up", "down"}


_GATE_UP_PTX = f"""
import sys, torch
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from test_fused_pre_norm_geglu_cute import CUTE
m, d, ff = 256, 128, 96  # the kernel is compiled for symbolic sizes: the op's, at small ones
x, folded = torch.randn(m, d, device="cuda").bfloat16(), torch.randn(2 * ff, d, device="cuda").bfloat16()
stats, fold = torch.rand(2, m, device="cuda") + 0.5, torch.randn(2, 2 * ff, device="cuda")
CUTE.gate_up(x, stats, folded, fold, torch.empty(m, ff, device="cuda", dtype=torch.bfloat16), "none", "small")
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@needs_cute
def test_gpu_gate_up_waits_for_the_statistics_kernel_in_its_epilogue_only(tmp_path):
    """The gate/up GEMM's PTX, compiled afresh: no `griddepcontrol.wait` in the producer warps (which come
    first), one after the first wgmma and before h's first store, where the epilogue reads the statistics;
    QuACK's own wait before the first load where the version is not the one this was written against."""
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path), QUACK_CACHE_ENABLED="0")
    subprocess.run([sys.executable, "-c", _GATE_UP_PTX], env=env, check=True, timeout=600)
    (ptx_file,) = tmp_path.glob("*folded_ln_geglu*.ptx")
    ptx = ptx_file.read_text().splitlines()
    waits = [i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line]
    first = {name: next(i for i, line in enumerate(ptx) if pattern in line) for name, pattern in [
        ("consumers", "setmaxnreg.inc"), ("wgmma", "wgmma.mma_async"), ("h store", "cp.async.bulk.tensor.2d.global")]}
    if CUTE.WAIT_IN_EPILOGUE:
        assert waits and min(waits) > first["wgmma"] > first["consumers"], (waits, first)
        assert any(first["wgmma"] < w < first["h store"] for w in waits), (waits, first)
    else:
        assert waits and min(waits) < first["consumers"], (waits, first)
