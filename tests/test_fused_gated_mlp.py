"""fused_gated_mlp: the Triton kernels against fp64 math (Triton's interpreter on CPU in fp32/fp16; bf16 on the
GPU, where real shapes run), every norm × activation × bias, residual or not, odd row counts, d_ff shards; the
custom op (fake, torch.compile fullgraph, autograd through the reference); argument errors; the coverage
behaviour (fallback recorded, strict raises).

Tolerances: relative norm error against the fp64 reference on the same (rounded) inputs and weights.
  fp32: sums in fp32 over a few hundred terms: far under 1e-5.
  fp16: h, n, a and out are each rounded once to fp16 (u = 4.9e-4, ~u/√3 each in norm), as the reference
        rounds them (the kernels keep [g; u] in fp32, the reference rounds it: one rounding more there): 2e-3 = 4u.
  bf16 (GPU): the same roundings with u = 3.9e-3: 1e-2; and no worse than 1.25x the engines' own bf16 sequence
        (the reference run in bf16: norm, GEMM, act_and_mul, GEMM, each rounding) + 1e-3.
"""
import dataclasses
import pathlib

import pytest
import torch

import sk
from numerics import KERNEL_DEVICE, rel_err
from sk.ops.gated_mlp import ACTIVATIONS, NORMS, gated_mlp_reference, triton_kernels as tk

INTERPRETED_CPU = KERNEL_DEVICE == "cpu" and sk.settings.get("triton_interpret")
needs_interpreter = pytest.mark.skipif(not INTERPRETED_CPU, reason="needs TRITON_INTERPRET=1 on a CPU-only machine")
EPS = 1e-6
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
SMALL_GATE_UP = tk.GemmConfig(16, 32, 32, 4, 2)
SMALL_DOWN = tk.GemmConfig(16, 16, 32, 4, 2, split_k=0)


def make_block(d, ff, norm, *, bias=True, dtype=torch.float32, device=KERNEL_DEVICE, seed=0):
    """Weights like a trained block's: norm scale near 1 (near 0 for Gemma's 1 + w), nn.Linear-scaled GEMMs."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen)).to(device, dtype)
    return dict(
        norm_weight=rnd(d, scale=0.2, shift=0.0 if norm == "gemma_rms" else 1.0),
        gate_up_weight=rnd(2 * ff, d, scale=d ** -0.5), down_weight=rnd(d, ff, scale=ff ** -0.5),
        norm_bias=rnd(d, scale=0.1) if bias and norm == "layer" else None,
        gate_up_bias=rnd(2 * ff, scale=0.1) if bias else None, down_bias=rnd(d, scale=0.1) if bias else None)


def make_x(m, d, dtype, device=KERNEL_DEVICE, seed=1, mean=0.3):
    gen = torch.Generator().manual_seed(seed)
    return (mean + torch.randn(m, d, generator=gen)).to(device, dtype)


def fp64(block, x, residual, norm, activation):
    def f(t):
        return None if t is None else t.double()
    w = {k: f(v) for k, v in block.items()}
    return gated_mlp_reference(f(x), w["norm_weight"], w["gate_up_weight"], w["down_weight"], EPS, residual=f(residual),
                               norm=norm, activation=activation, norm_bias=w["norm_bias"],
                               gate_up_bias=w["gate_up_bias"], down_bias=w["down_bias"])


def call_op(block, x, residual, norm, activation):
    return sk.ops.fused_gated_mlp(x, block["norm_weight"], block["gate_up_weight"], block["down_weight"], EPS,
                                  residual=residual, norm=norm, activation=activation, norm_bias=block["norm_bias"],
                                  gate_up_bias=block["gate_up_bias"], down_bias=block["down_bias"])


def run_kernels(block, x, residual, norm, activation, gate_up=SMALL_GATE_UP, down=SMALL_DOWN):
    m, d = x.shape
    ff = block["down_weight"].shape[1]
    configs = tk.fit_configs(gate_up, down, m, d, ff, tk.sm_count(x.device))
    return tk.forward_kernels(x, residual, block["norm_weight"], block["norm_bias"],
                              block["gate_up_weight"].to(x.dtype), block["gate_up_bias"],
                              block["down_weight"].to(x.dtype), block["down_bias"], EPS, norm, activation, configs)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every buffer the op allocates starts as NaN, so an element a kernel fails to write shows up."""
    for name in ("empty", "empty_like"):
        allocate = getattr(torch, name)

        def poisoned(*args, allocate=allocate, **kwargs):
            t = allocate(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        monkeypatch.setattr(torch, name, poisoned)


# ----------------------------------------------------------------------------------------------- interpreter (CPU)

@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("norm", NORMS)
def test_interpreted_kernels_match_fp64(norm, activation, bias, dtype, poisoned_outputs):
    """Every norm × activation × bias in both interpreted dtypes; a residual with the biases, none without;
    3 rows (a partial row tile), d_model 64 (two K blocks), d_ff 96 (a partial column tile, split-K down)."""
    m, d, ff = 3, 64, 96
    block = make_block(d, ff, norm, bias=bias, seed=len(norm) + bias)
    block = {k: v if v is None or k.endswith("bias") or k == "norm_weight" else v.to(dtype) for k, v in block.items()}
    x = make_x(m, d, dtype)
    residual = make_x(m, d, dtype, seed=2, mean=0.0) if bias else None
    out, h = run_kernels(block, x, residual, norm, activation)
    want, want_h = fp64(block, x, residual, norm, activation)
    assert out.dtype == dtype and out.shape == (m, d)
    assert rel_err(out, want) < TOL[dtype]
    if residual is not None:  # h = x + residual rounded once, as the engines round it
        assert torch.equal(h, (x.float() + residual.float()).to(dtype))


LAUNCHES = {
    "plain": (SMALL_GATE_UP, SMALL_DOWN),
    "swap": (dataclasses.replace(SMALL_GATE_UP, swap_ab=True), dataclasses.replace(SMALL_DOWN, swap_ab=True)),
    "swap_no_split": (dataclasses.replace(SMALL_GATE_UP, swap_ab=True),
                      dataclasses.replace(SMALL_DOWN, swap_ab=True, split_k=1)),
    "grouped": (dataclasses.replace(SMALL_GATE_UP, group_m=2), dataclasses.replace(SMALL_DOWN, group_m=2, split_k=3)),
}


@needs_interpreter
@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("residual", [True, False])
def test_interpreted_launch_variants(launch, m, residual, poisoned_outputs):
    """Each way of launching (transposed products, grouped tiles, split or not) at 1 and 33 rows (a lone row;
    three row tiles, the last of one row), LayerNorm and RMSNorm in fp16, with and without a residual."""
    d, ff = 64, 128
    norm, activation = ("layer", "gelu") if m == 1 else ("rms", "silu")
    block = make_block(d, ff, norm, seed=m)
    block["gate_up_weight"], block["down_weight"] = (block[k].half() for k in ("gate_up_weight", "down_weight"))
    x = make_x(m, d, torch.float16)
    r = make_x(m, d, torch.float16, seed=3, mean=0.0) if residual else None
    out, _ = run_kernels(block, x, r, norm, activation, *LAUNCHES[launch])
    assert rel_err(out, fp64(block, x, r, norm, activation)[0]) < TOL[torch.float16]


def test_large_blocks_stop_the_fused_kernels_at_fewer_rows():
    # Llama-3-8B's 4096 x 14336 composes above 8 rows; Gemma-2B, Llama-3.2-1B and smaller blocks above 32 (the
    # H200 measurements behind LARGE_MLP); Qwen3-8B's 4096 x 12288 too, through its tuned "m32" entry (the
    # H100 sweep of 2026-12-07 measured its fused pair 5 % faster than the composed route at 16 and 32 rows).
    assert tk.fused_max_m(4096, 14336) == 8
    assert tk.fused_max_m(4096, 12288) == 32
    assert tk.fused_max_m(2048, 16384) == tk.fused_max_m(2048, 8192) == tk.fused_max_m(64, 96) == 32


def fused_rows_of_a_large_block(monkeypatch, rows, seed, residual):
    """Run a 64 x 96 fp16 block made larger than LARGE_MLP at each of `rows` (strict, against fp64: out, and h
    with a residual); return the row counts that went through the fused kernels."""
    monkeypatch.setattr(tk, "LARGE_MLP", 64 * 96 - 1)
    block = make_block(64, 96, "rms", seed=seed)
    block = {k: v if v is None or k == "norm_weight" else v.half() for k, v in block.items()}
    fused_calls = []
    real = tk.forward_kernels
    monkeypatch.setattr(tk, "forward_kernels", lambda *a, **k: fused_calls.append(a[0].shape[0]) or real(*a, **k))
    for m in rows:
        x = make_x(m, 64, torch.float16, seed=m)
        r = make_x(m, 64, torch.float16, seed=m + 1, mean=0.0) if residual else None
        with torch.no_grad(), sk.coverage.strict():
            out, h = call_op(block, x, r, "rms", "silu")
        ref_out, ref_h = fp64(block, x, r, "rms", "silu")
        assert rel_err(out, ref_out) < TOL[torch.float16]
        if residual:
            assert rel_err(h, ref_h) < TOL[torch.float16]
    return fused_calls


@needs_interpreter
def test_interpreted_large_block_rows_past_its_limit_compose(monkeypatch):
    """A block above LARGE_MLP (made small here) runs the fused kernels up to 8 rows and composes at 9."""
    assert fused_rows_of_a_large_block(monkeypatch, (8, 9), seed=5, residual=False) == [8]


@needs_interpreter
def test_interpreted_large_block_with_a_tuned_m32_entry_runs_the_fused_kernels_to_32_rows(monkeypatch):
    """A block above LARGE_MLP with an "m32" entry in TUNED (its sweep measured the fused kernels faster than the
    composed route there) runs them up to FUSED_MAX_M rows, with that entry's configs, and composes above."""
    monkeypatch.setattr(tk, "LARGE_MLP", 64 * 96 - 1)
    assert tk.fused_max_m(64, 96) == tk.FUSED_MAX_M_LARGE
    monkeypatch.setitem(tk.TUNED, ("m32", 64, 96), (tk.GATE_UP_CONFIGS["m32"], tk.DOWN_CONFIGS["m32"]))
    assert tk.fused_max_m(64, 96) == tk.FUSED_MAX_M
    tk.choose_configs.cache_clear()
    try:
        rows = (9, tk.FUSED_MAX_M, tk.FUSED_MAX_M + 1)
        assert fused_rows_of_a_large_block(monkeypatch, rows, seed=6, residual=True) == [9, tk.FUSED_MAX_M]
    finally:
        tk.choose_configs.cache_clear()


@needs_interpreter
@pytest.mark.parametrize("norm,activation", [("rms", "silu"), ("gemma_rms", "gelu_tanh"), ("gemma_rms", "gelu")])
@pytest.mark.parametrize("residual", [True, False])
def test_interpreted_rows_above_the_fused_limit_compose_our_norm_and_act_with_gemms(norm, activation, residual,
                                                                                      monkeypatch, poisoned_outputs):
    """Above FUSED_MAX_M rows the op runs our norm and activation kernels around two GEMMs (fp16; biases on):
    the fused kernels are not launched, the answer matches fp64, h is x + residual rounded once; at the
    limit the fused kernels run."""
    d, ff, m = 64, 96, tk.FUSED_MAX_M + 1
    block = make_block(d, ff, norm, seed=7)
    block = {k: v if v is None or k == "norm_weight" else v.half() for k, v in block.items()}
    x = make_x(m, d, torch.float16)
    r = make_x(m, d, torch.float16, seed=2, mean=0.0) if residual else None
    fused_calls = []
    real = tk.forward_kernels
    monkeypatch.setattr(tk, "forward_kernels", lambda *a, **k: fused_calls.append(a[0].shape[0]) or real(*a, **k))
    with torch.no_grad(), sk.coverage.strict():
        out, h = call_op(block, x, r, norm, activation)
        call_op(block, x[:tk.FUSED_MAX_M], None if r is None else r[:tk.FUSED_MAX_M], norm, activation)
    assert fused_calls == [tk.FUSED_MAX_M]
    assert rel_err(out, fp64(block, x, r, norm, activation)[0]) < TOL[torch.float16]
    if residual:
        assert torch.equal(h, (x.float() + r.float()).half())
    else:
        assert h is x


@needs_interpreter
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_interpreted_op_on_tensor_parallel_shards(tp, poisoned_outputs):
    """The public op with the table's configs on d_ff shards of a base block (d_ff 256 / tp: the first d_ff/tp
    gate rows, the matching up rows and down columns), fp16, rows in leading dims."""
    d, ff = 64, 256
    full = make_block(d, ff, "rms", dtype=torch.float16, seed=7)
    part = ff // tp
    gu = full["gate_up_weight"]
    block = dict(full, gate_up_weight=torch.cat([gu[:part], gu[ff: ff + part]]),
                 gate_up_bias=torch.cat([full["gate_up_bias"][:part], full["gate_up_bias"][ff: ff + part]]),
                 down_weight=full["down_weight"][:, :part].contiguous())
    x = make_x(6, d, torch.float16).view(2, 3, d)
    r = make_x(6, d, torch.float16, seed=4, mean=0.0).view(2, 3, d)
    out, h = call_op(block, x, r, "rms", "silu")
    assert out.shape == x.shape and h.shape == x.shape
    assert rel_err(out, fp64(block, x, r, "rms", "silu")[0]) < TOL[torch.float16]
    assert sk.coverage.report()["kernel_calls"] == {"fused_gated_mlp/rms": 1}
    assert not sk.coverage.report()["fallbacks"]


@needs_interpreter
def test_interpreted_compiled_and_eager_paths_agree():
    """torch.compile(fullgraph=True) traces the custom op (its fake gives the shapes) and runs the same kernels."""
    d, ff = 64, 128
    block = make_block(d, ff, "gemma_rms", dtype=torch.float16, seed=5)
    x, r = make_x(5, d, torch.float16), make_x(5, d, torch.float16, seed=6, mean=0.0)

    def fn(x, r):
        out, h = call_op(block, x, r, "gemma_rms", "gelu_tanh")
        return out * 2, h
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    got, want = compiled(x, r), fn(x, r)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert sk.coverage.report()["kernel_calls"]["fused_gated_mlp/gemma_rms"] == 2


@needs_interpreter
def test_interpreted_empty_batch():
    d, ff = 64, 128
    block = make_block(d, ff, "rms", dtype=torch.float16)
    x = make_x(0, d, torch.float16)
    out, h = call_op(block, x, x.clone(), "rms", "silu")
    assert out.shape == (0, d) and h.shape == (0, d)
    out, h = call_op(block, x.view(0, 3, d), None, "rms", "silu")
    assert out.shape == (0, 3, d) and h.shape == (0, 3, d)


@needs_interpreter
def test_interpreted_kernels_read_the_weights_as_given():
    """No copy of a weight in the compute dtype: the kernels read gate/up and down where they are, so an in-place
    update (any way, `.data` included) is seen by the next call; weights of another dtype are cast once, cached
    until they change."""
    d, ff = 64, 128
    block = make_block(d, ff, "layer", dtype=torch.float16)
    x = make_x(2, d, torch.float16)
    before = sk.ops.weight_cache.size_bytes()
    out1, _ = call_op(block, x, None, "layer", "silu")
    assert sk.ops.weight_cache.size_bytes() == before
    assert sk.coverage.report()["weights_prepared"] == {}
    block["gate_up_weight"].data.mul_(2)  # through .data: no version counter
    block["norm_weight"].mul_(2)
    out2, _ = call_op(block, x, None, "layer", "silu")
    assert rel_err(out2, fp64(block, x, None, "layer", "silu")[0]) < TOL[torch.float16]
    assert not torch.equal(out1, out2)
    fp32 = dict(block, gate_up_weight=block["gate_up_weight"].float(), down_weight=block["down_weight"].float())
    for _ in range(2):
        out3, _ = call_op(fp32, x, None, "layer", "silu")
    assert sk.ops.weight_cache.size_bytes() - before == 3 * ff * d * 2  # both casts to fp16, made once
    assert sk.coverage.report()["weights_prepared"] == {"fused_gated_mlp/layer": 2}
    assert torch.equal(out3, out2)


class EngineParameter(torch.nn.Parameter):
    """Like vLLM's and SGLang's weight classes (`ModelWeightParameter`): a Parameter subclass with Python
    behaviour (a weight loader, a `__torch_function__` override), real memory underneath."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def engine_parameters(block):
    """The block's weights as an engine holds them: our stand-in class, and vLLM's own where it is installed."""
    classes = [EngineParameter]
    try:
        from vllm.model_executor.parameter import ModelWeightParameter
        classes.append(ModelWeightParameter)
    except ImportError:
        pass
    for cls in classes:
        # _make_subclass: vLLM's constructor needs its tensor-parallel groups; the class is what matters here.
        yield cls, {k: None if v is None else torch.nn.Parameter._make_subclass(cls, v, False)
                    for k, v in block.items()}


@needs_interpreter
def test_interpreted_engine_parameter_classes_run_without_copies():
    # vLLM's weights are ModelWeightParameter: a copy per call (and inside every replayed graph) once made decode
    # 2.7x slower in vLLM (results/h200/engines/README.md, 2026-12-02); now nothing is copied at all.
    d, ff = 64, 128
    x = make_x(3, d, torch.float16)
    for cls, block in engine_parameters(make_block(d, ff, "rms", dtype=torch.float16)):
        sk.coverage.reset()
        assert type(block["gate_up_weight"]) is cls
        first = call_op(block, x, x.clone(), "rms", "silu")[0]
        assert torch.equal(call_op(block, x, x.clone(), "rms", "silu")[0], first)
        assert sk.coverage.report()["weights_prepared"] == {}  # what engine reports show
        with torch.no_grad():
            block["gate_up_weight"].mul_(2)  # an in-place weight update is seen
        assert not torch.equal(call_op(block, x, x.clone(), "rms", "silu")[0], first)
        assert not sk.coverage.report()["fallbacks"]


# ----------------------------------------------------------------------------------------------- op, any device

@pytest.mark.parametrize("norm", NORMS)
def test_fp32_takes_the_recorded_fallback_and_trains(norm):
    """fp32 is outside the published table: the reference runs (recorded with the reason), except under Triton's
    interpreter, where the kernels run it (the table's interpreted_precisions: how the engines' fp32 CPU runs
    exercise them); with grad on, the backward is autograd of the reference (recorded as a backward fallback) and
    matches fp64's gradients."""
    d, ff = 16, 24
    block = make_block(d, ff, norm, device="cpu", seed=3)
    x = make_x(4, d, torch.float32, "cpu").requires_grad_()
    r = make_x(4, d, torch.float32, "cpu", seed=2).requires_grad_()
    leaves = {k: v.requires_grad_() if v is not None else None for k, v in block.items()}
    out, h = call_op(leaves, x, r, norm, "gelu")
    want, want_h = fp64(leaves, x, r, norm, "gelu")
    assert rel_err(out, want) < 1e-5 and rel_err(h, want_h) < 1e-6
    (out.sum() + h.square().sum()).backward()
    got = [x.grad, r.grad] + [v.grad for v in leaves.values() if v is not None]
    x64, r64 = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    l64 = {k: v.detach().double().requires_grad_() if v is not None else None for k, v in leaves.items()}
    o64, h64 = fp64(l64, x64, r64, norm, "gelu")
    (o64.sum() + h64.square().sum()).backward()
    for a, b in zip(got, [x64.grad, r64.grad] + [v.grad for v in l64.values() if v is not None]):
        assert rel_err(a, b) < 1e-5
    reasons = {f["reason"] for f in sk.coverage.report()["fallbacks"] if f["op"] == f"fused_gated_mlp/{norm}"}
    forward_reasons = {why for why in reasons if not why.startswith("backward")}
    if INTERPRETED_CPU:
        assert not forward_reasons and sk.coverage.report()["kernel_calls"][f"fused_gated_mlp/{norm}"] > 0
    else:
        assert forward_reasons and all("CPU tensor" in why for why in forward_reasons), forward_reasons
    assert any("backward" in why for why in reasons)


@pytest.mark.skipif(KERNEL_DEVICE != "cuda", reason="fp32 on a GPU: CUDA only")
def test_fp32_on_the_gpu_takes_the_recorded_fallback():
    d, ff = 64, 96
    block = make_block(d, ff, "rms")
    x = make_x(3, d, torch.float32)
    out, _ = call_op(block, x, None, "rms", "silu")
    assert rel_err(out, fp64(block, x, None, "rms", "silu")[0]) < 1e-5
    (miss,) = sk.coverage.report()["fallbacks"]
    assert miss["reason"] == "dtype fp32 is not covered (bf16, fp16)" and miss["op"] == "fused_gated_mlp/rms"


def test_no_residual_returns_x_itself():
    d, ff = 16, 24
    block = make_block(d, ff, "rms", device="cpu")
    x = make_x(3, d, torch.float32, "cpu")
    out, h = call_op(block, x, None, "rms", "silu")
    assert h is x
    assert rel_err(out, fp64(block, x, None, "rms", "silu")[0]) < 1e-5


def test_strict_mode_raises_on_a_fallback():
    d, ff = 16, 24
    block = make_block(d, ff, "rms", device="cpu", dtype=torch.float64)
    x = make_x(3, d, torch.float64, "cpu")  # fp64: no kernel anywhere
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="fused_gated_mlp/rms"):
        call_op(block, x, None, "rms", "silu")


@needs_interpreter
def test_widths_not_multiples_of_8_take_the_recorded_fallback():
    d, ff = 20, 36
    block = make_block(d, ff, "rms", dtype=torch.float16)
    x = make_x(3, d, torch.float16)
    out, _ = call_op(block, x, None, "rms", "silu")
    assert rel_err(out, fp64(block, x, None, "rms", "silu")[0]) < TOL[torch.float16]
    (miss,) = sk.coverage.report()["fallbacks"]
    assert "multiples of 8" in miss["reason"] and miss["op"] == "fused_gated_mlp/rms"
    with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="multiples of 8"):
        call_op(block, x, None, "rms", "silu")


def _args(**changes):
    d, ff = 16, 24
    block = make_block(d, ff, "rms", device="cpu")
    kwargs = dict(x=make_x(3, d, torch.float32, "cpu"), eps=EPS, **block)
    kwargs.update(changes)
    return kwargs


@pytest.mark.parametrize("bad,match", [
    (dict(norm="batch"), "norm must be one of"),
    (dict(activation="relu"), "activation must be one of"),
    (dict(eps=-1.0), "eps must be a non-negative"),
    (dict(gate_up_weight=torch.randn(47, 16)), r"gate_up_weight must be \(2·d_ff, d_model\)"),
    (dict(down_weight=torch.randn(16, 23)), r"down_weight \(16, 23\) \(expected \(16, 24\)\)"),
    (dict(norm_weight=torch.randn(15)), r"norm_weight \(15,\)"),
    (dict(residual=torch.randn(3, 15)), r"residual \(3, 15\)"),
    (dict(residual=torch.randn(3, 16, dtype=torch.float64)), "residual must have x's dtype"),
    (dict(norm_bias=torch.randn(16)), "norm_bias is only used by norm='layer'"),
    (dict(x=torch.randn(3, 16, dtype=torch.float64).to(torch.int32)), "supported: bfloat16"),
    (dict(gate_up_bias=torch.randn(47)), r"gate_up_bias \(47,\)"),
])
def test_argument_errors_are_clear(bad, match):
    kwargs = _args(**bad)
    with pytest.raises((ValueError, TypeError), match=match):
        sk.ops.fused_gated_mlp(**kwargs)


@pytest.mark.parametrize("rows", [1, 2])
def test_the_custom_op_refuses_a_residual_of_another_shape(rows):
    """A compiler pass that rewrites the graph after tracing (vLLM's sequence-parallel pass) can hand the custom op
    a residual split across ranks; one row would even broadcast in the reference. Both the op and its fake raise."""
    d, ff = 16, 24
    block = make_block(d, ff, "rms", device="cpu")
    x, r = make_x(4, d, torch.float32, "cpu"), make_x(rows, d, torch.float32, "cpu", seed=2)
    args = (x, r, block["norm_weight"], None, block["gate_up_weight"], None, block["down_weight"], None, EPS, "rms",
            "silu")
    match = rf"fused_gated_mlp: residual \({rows}, 16\) must have x's shape \(4, 16\)"
    with pytest.raises(ValueError, match=match):
        torch.ops.sk.fused_gated_mlp(*args)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode, pytest.raises(ValueError, match=match):
        torch.ops.sk.fused_gated_mlp(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))


def test_custom_op_registration_passes_opcheck():
    d, ff = 16, 24
    block = make_block(d, ff, "layer", device="cpu", dtype=torch.float64)
    x, r = make_x(5, d, torch.float64, "cpu"), make_x(5, d, torch.float64, "cpu", seed=2)
    for residual in (r, None):
        args = (x, residual, block["norm_weight"], block["norm_bias"], block["gate_up_weight"], block["gate_up_bias"],
                block["down_weight"], block["down_bias"], EPS, "layer", "silu")
        torch.library.opcheck(torch.ops.sk.fused_gated_mlp.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_decode_configs_swap_and_split_to_fill_the_gpu():
    for m in (1, 8, 32):
        gate_up, down = tk.choose_configs(m, 4096, 14336, 132)
        assert gate_up.swap_ab and down.swap_ab and gate_up.block_m == down.block_m == max(16, m)
        tiles = 4096 // down.block_n
        # At least the waves the table's entry asks for (one at M = 32, where the sweep found more slower).
        want = int(tk.DOWN_CONFIGS[tk.shape_class(m)].split_waves * 132)
        assert tiles * down.split_k >= want or down.split_k == tk.MAX_SPLIT_K
        assert -(-2 * 14336 // gate_up.block_n) >= 132  # the gate/up grid fills the SMs
    gate_up, down = tk.choose_configs(8192, 4096, 14336, 132)
    assert not gate_up.swap_ab and down.split_k == 1 and gate_up.block_m == 128
    root = pathlib.Path(__file__).resolve().parents[1]
    for key, (gate_up, down) in tk.TUNED.items():  # every tuned entry names its committed result
        assert (root / gate_up.source).is_file() and (root / down.source).is_file(), key


# ----------------------------------------------------------------------------------------------- GPU (bf16)

GPU_SHAPES = [(1, 2048, 8192, "rms", "silu"), (8, 4096, 7168, "rms", "silu"), (32, 4096, 3584, "rms", "silu"),
              (3, 4096, 3584, "rms", "silu"),  # TP-4's tuned decode entry
              (17, 4096, 12288, "rms", "silu"),  # Qwen3-8B's tuned 32-row entry
              (33, 1024, 3072, "layer", "gelu"), (128, 2048, 16384, "gemma_rms", "gelu_tanh"),
              (1000, 3584, 14336, "gemma_rms", "gelu_tanh"), (2048, 1024, 3072, "rms", "silu")]


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff,norm,activation", GPU_SHAPES)
@pytest.mark.parametrize("residual", [True, False])
def test_gpu_bf16_matches_fp64_and_the_engines_sequence(m, d, ff, norm, activation, residual):
    block = make_block(d, ff, norm, dtype=torch.bfloat16, device="cuda", seed=m)
    x = make_x(m, d, torch.bfloat16, "cuda")
    r = make_x(m, d, torch.bfloat16, "cuda", seed=2, mean=0.0) if residual else None
    with torch.no_grad(), sk.coverage.strict():
        out, h = call_op(block, x, r, norm, activation)
    want, _ = fp64(block, x, r, norm, activation)
    peer = gated_mlp_reference(x, block["norm_weight"], block["gate_up_weight"], block["down_weight"], EPS,
                               residual=r, norm=norm, activation=activation, norm_bias=block["norm_bias"],
                               gate_up_bias=block["gate_up_bias"], down_bias=block["down_bias"])[0]
    ours, theirs = rel_err(out, want), rel_err(peer, want)
    assert ours < TOL[torch.bfloat16] and ours <= 1.25 * theirs + 1e-3, (ours, theirs)
    if residual:
        assert torch.equal(h, (x.float() + r.float()).bfloat16())


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,ff", [(1, 4096, 14336), (32, 4096, 3584), (256, 2048, 8192)])
def test_gpu_graph_replay_with_fresh_inputs_and_deterministic_split_k(m, d, ff, settings_override):
    """A captured call replayed onto fresh inputs (copied into the static ones) and poisoned outputs gives the
    eager call's bits; with PDL off too (stream order), the same bits."""
    block = make_block(d, ff, "rms", dtype=torch.bfloat16, device="cuda", seed=1)
    x, r = make_x(m, d, torch.bfloat16, "cuda"), make_x(m, d, torch.bfloat16, "cuda", seed=2)
    with torch.no_grad():
        call_op(block, x, r, "rms", "silu")  # prepares the weights and compiles before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, h = call_op(block, x, r, "rms", "silu")
        for seed in range(3):
            x.copy_(make_x(m, d, torch.bfloat16, "cuda", seed=10 + seed))
            r.copy_(make_x(m, d, torch.bfloat16, "cuda", seed=20 + seed))
            want = call_op(block, x, r, "rms", "silu")
            out.fill_(float("nan"))
            h.fill_(float("nan"))
            graph.replay()
            assert torch.equal(out, want[0]) and torch.equal(h, want[1])
        with sk.settings.override(gated_mlp_pdl=False):
            assert torch.equal(call_op(block, x, r, "rms", "silu")[0], want[0])
    assert not [f for f in sk.coverage.report()["fallbacks"]]


@pytest.mark.gpu
def test_gpu_capture_with_engine_parameter_classes_reads_the_weights_themselves():
    """Weights as vLLM holds them (a Parameter subclass): nothing is copied for the capture (no copy kernels in
    the graph, no capture miss recorded), and replays give the eager bits."""
    m, d, ff = 1, 2048, 8192
    x, r = make_x(m, d, torch.bfloat16, "cuda"), make_x(m, d, torch.bfloat16, "cuda", seed=2)
    before = sk.ops.weight_cache.size_bytes()
    for cls, block in engine_parameters(make_block(d, ff, "rms", dtype=torch.bfloat16, device="cuda", seed=1)):
        with torch.no_grad():
            want = call_op(block, x, r, "rms", "silu")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out, h = call_op(block, x, r, "rms", "silu")
            out.fill_(float("nan"))
            graph.replay()
        assert torch.equal(out, want[0]) and torch.equal(h, want[1]), cls
    assert sk.ops.weight_cache.size_bytes() == before and sk.coverage.report()["weights_prepared"] == {}
    assert not sk.coverage.report()["fallbacks"]


@pytest.mark.gpu
def test_gpu_weights_written_through_data_reach_a_captured_graph():
    """An engine's weight loader writes through .data (no version counter moves) while its CUDA graphs keep
    replaying: the kernels read the weights themselves, so the graph captured before the update computes with
    the new weights, as an eager call on fresh copies of them does, with no call in between."""
    m, d, ff = 4, 2048, 8192
    x, r = make_x(m, d, torch.bfloat16, "cuda"), make_x(m, d, torch.bfloat16, "cuda", seed=2)
    block = make_block(d, ff, "rms", bias=False, dtype=torch.bfloat16, device="cuda", seed=1)
    with torch.no_grad():
        call_op(block, x, r, "rms", "silu")  # compiles before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = call_op(block, x, r, "rms", "silu")
        new = make_block(d, ff, "rms", bias=False, dtype=torch.bfloat16, device="cuda", seed=3)
        for name in ("norm_weight", "gate_up_weight", "down_weight"):
            block[name].data.copy_(new[name])
        out.fill_(float("nan"))
        graph.replay()
        want, _ = call_op({k: None if v is None else v.clone() for k, v in new.items()}, x, r, "rms", "silu")
    assert torch.equal(out, want)
    assert not sk.coverage.report()["fallbacks"]


@pytest.mark.gpu
def test_gpu_chained_layers_match_stream_order():
    """Layers chained through out/h in one graph (each kernel launched dependently on the one before it) give
    the bits of calls synchronized one by one."""
    m, d, ff = 8, 2048, 8192
    block = make_block(d, ff, "rms", dtype=torch.bfloat16, device="cuda", seed=3)
    x0, r0 = make_x(m, d, torch.bfloat16, "cuda"), make_x(m, d, torch.bfloat16, "cuda", seed=2)

    def chain(sync=False):
        x, r, outs = x0, r0, []
        for _ in range(6):
            x, r = call_op(block, x, r, "rms", "silu")
            outs.append(x)
            if sync:
                torch.cuda.synchronize()
        return outs
    with torch.no_grad():
        want = chain(sync=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain()
        for _ in range(3):
            graph.replay()
            assert all(torch.equal(a, b) for a, b in zip(got, want))


# ------------------------------------------------------------------------------------ compiled for sm90 (any machine)

_COMPILE_CHECK = r"""
import dataclasses, json, re, sys
sys.path.insert(0, "benchmarks")
from compile_report_gated_mlp import compile_kernel, report, tk
print(json.dumps(report()))
"""


def test_table_configs_compile_for_sm90_on_wgmma_with_every_operand_fully_buffered():
    """No interpreter shows a pipelining race: compile both GEMM kernels for sm90 (Triton's own ptxas, no GPU) at
    every shape class's config and each tuned entry's, and check that every operand tile (gate/up: n, the gate half
    and the up half; down: two) gets num_stages shared buffers (the GEGLU op's H200 failure: one fewer for a tile
    also read from registers) and that the products run on wgmma. Subprocess: without the interpreter."""
    from sm90_compile import run_compile_check

    for kernel, r in run_compile_check(_COMPILE_CHECK).items():
        tiles = 3 if kernel.startswith("gate_up") else 2
        assert r["wgmma"] and r["buffers"] == [r["stages"]] * tiles, (kernel, r)


@needs_interpreter
def test_prepare_weights_makes_only_the_casts_the_calls_read():
    """What an engine calls once its weights are loaded: with weights in the activations' dtype (an engine's),
    nothing is made; weights of another dtype get their cast then, which the calls read."""
    d, ff = 64, 96
    block = make_block(d, ff, "rms", dtype=torch.float16)
    assert sk.ops.gated_mlp.prepare_weights(block["norm_weight"], block["gate_up_weight"],
                                            gate_up_bias=block["gate_up_bias"], down_weight=block["down_weight"])
    assert sk.coverage.report()["weights_prepared"] == {}
    fp32 = dict(block, gate_up_weight=block["gate_up_weight"].float(), down_weight=block["down_weight"].float())
    assert sk.ops.gated_mlp.prepare_weights(fp32["norm_weight"], fp32["gate_up_weight"],
                                            down_weight=fp32["down_weight"], dtype=torch.float16)
    assert sk.coverage.report()["weights_prepared"] == {"fused_gated_mlp/rms": 2}
    call_op(fp32, make_x(3, d, torch.float16), None, "rms", "silu")
    assert sk.coverage.report()["weights_prepared"] == {"fused_gated_mlp/rms": 2}
    with pytest.raises(ValueError, match="prepare_weights: norm must be one of 'rms', 'gemma_rms', 'layer'; got 'foo'"):
        sk.ops.gated_mlp.prepare_weights(block["norm_weight"], block["gate_up_weight"], norm="foo")
    with pytest.raises(ValueError,
                       match=r"gate_up_weight must be \(2·d_ff, d_model\), gate rows first; got \(3, 64\)"):
        sk.ops.gated_mlp.prepare_weights(block["norm_weight"], block["gate_up_weight"][:3])
    # fp64 is outside every kernel's cover: nothing is made, nothing recorded.
    assert not sk.ops.gated_mlp.prepare_weights(block["norm_weight"].double(), block["gate_up_weight"].double())
    assert sk.coverage.report()["weights_prepared"] == {"fused_gated_mlp/rms": 2}
    assert not sk.coverage.report()["fallbacks"]


@needs_interpreter
def test_interpreted_bf16_runs_the_reference_recorded():
    """Triton's interpreter computes bf16 tl.dot wrongly: on CPU a bf16 call takes the reference, recorded."""
    block = {k: None if v is None else v.bfloat16() for k, v in make_block(16, 24, "rms", bias=False).items()}
    x = make_x(3, 16, torch.bfloat16)
    sk.coverage.reset()
    out, _ = call_op(block, x, None, "rms", "silu")
    (miss,) = sk.coverage.report()["fallbacks"]
    assert miss["op"] == "fused_gated_mlp/rms" and "interpreter" in miss["reason"], miss
    assert rel_err(out, fp64(block, x, None, "rms", "silu")[0]) < TOL[torch.bfloat16]


@needs_interpreter
def test_interpreted_autocast_leaves_a_half_precision_x_in_its_dtype_on_every_route():
    # Autocast to bf16 around an fp16 x: the fused kernels (few rows), the composed route (many rows) and the fake
    # all answer in fp16; only an fp32 x is converted to the autocast dtype (the interpreter's bf16 dot is wrong,
    # so that route is checked for its dtype on the reference here).
    block = make_block(64, 96, "rms", bias=False)
    block16 = {k: None if v is None else v.half() for k, v in block.items()}
    for m in (3, 40):
        x = make_x(m, 64, torch.float16)
        want, _ = call_op(block16, x, None, "rms", "silu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, h = call_op(block16, x, x.clone(), "rms", "silu")
            fake = torch.compile(lambda t: call_op(block16, t, None, "rms", "silu")[0], fullgraph=True,
                                 backend="aot_eager")(x)
        assert out.dtype == h.dtype == fake.dtype == torch.float16, (m, out.dtype, h.dtype, fake.dtype)
        assert rel_err(out, fp64(block16, x, x.clone(), "rms", "silu")[0]) < TOL[torch.float16]
        assert rel_err(want, fp64(block16, x, None, "rms", "silu")[0]) < TOL[torch.float16]
    with torch.autocast("cpu", dtype=torch.float16):
        out, _ = call_op(block16, make_x(3, 64, torch.float32), None, "rms", "silu")
    assert out.dtype == torch.float16


def test_sweep_suggests_an_m32_entry_only_where_the_fused_pair_beats_the_composed_route(monkeypatch):
    """The config sweep's Markdown gives the `TUNED` "m32" line for a block whose best fused pair beat the
    composed route by WIN at 32 rows, side by side, with that pair's unfitted configs; none where the lead is
    smaller or where the best pair at 16 rows lost."""
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_gated_mlp as bench

    gate_up = dataclasses.asdict(tk.GemmConfig(32, 256, 64, 4, 6, swap_ab=True, dependent_launch="at_start"))
    down = dataclasses.asdict(tk.GemmConfig(32, 64, 256, 4, 3, split_k=0, split_waves=2.0, swap_ab=True))
    other = dataclasses.asdict(tk.GemmConfig(32, 128, 128, 4, 4, swap_ab=True))

    def case(shape, m, best_us, composed_us):
        return {"shape": shape, "M": m, "d_model": 4096, "d_ff": 12288 if shape == "a" else 14336,
                "composed_us": composed_us, "pairs": [{"name": "gate_up #2 + down #1", "us": best_us,
                                                       "entry": [gate_up, down]},
                                                      {"name": "table", "us": best_us + 5, "entry": [other, other]}]}
    results = [case("a", 32, 80.0, 85.0), case("b", 32, 84.0, 85.0)]
    lines = bench.m32_entries(results)
    assert len(lines) == 1 and lines[0].startswith('("m32", 4096, 12288): (GemmConfig(block_m=32, block_n=256,')
    assert "split_waves=2.0" in lines[0] and "block_k=256" in lines[0]
    assert bench.m32_entries(results + [case("a", 16, 86.0, 85.0)]) == []
    assert len(bench.m32_entries(results + [case("a", 16, 84.0, 85.0)])) == 1
