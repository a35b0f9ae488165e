"""RMSNorm family: reference against fp64 math, kernel against the reference, in-place forms, edge cases."""
import importlib

import pytest
import torch

import sk
from numerics import DTYPES, KERNEL_DEVICE, ODD_WIDTHS, REAL_WIDTHS, TOLERANCE, poisoned_like, rel_err, seed_of
from sk.ops.rms_norm import fused_add_rms_norm_reference, rms_norm_reference

WIDTHS = ODD_WIDTHS + REAL_WIDTHS
LEADING = [(1,), (3,), (2, 5)]


def fp64_rms_norm(x, w, eps, offset=0.0):
    x, w = x.double(), w.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (w + offset)


def inputs(lead, n, dtype, device=KERNEL_DEVICE):
    g = torch.Generator().manual_seed(seed_of(lead, n, dtype))
    x = torch.randn(*lead, n, generator=g, dtype=torch.float32).to(device, dtype)
    r = torch.randn(*lead, n, generator=g, dtype=torch.float32).to(device, dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    return x, r, w


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_fp64_math(dtype):
    x, r, w = inputs((4,), 1023, dtype, "cpu")
    assert rel_err(rms_norm_reference(x, w, 1e-6), fp64_rms_norm(x, w, 1e-6)) < TOLERANCE[dtype]
    assert rel_err(rms_norm_reference(x, w, 1e-6, 1.0), fp64_rms_norm(x, w, 1e-6, 1.0)) < TOLERANCE[dtype]
    out, res = fused_add_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(res, (x.float() + r.float()).to(dtype))
    assert rel_err(out, fp64_rms_norm(res, w, 1e-6)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("lead", LEADING)
def test_kernels_match_reference(lead, n, dtype):
    x, r, w = inputs(lead, n, dtype)
    eps = 1e-5
    with sk.coverage.strict():  # strict: the kernel, not the fallback, produced these
        y = sk.ops.rms_norm(x, w, eps)
        g = sk.ops.gemma_rms_norm(x, w, eps)
        out, res = sk.ops.fused_add_rms_norm(x, r, w, eps)
        g_out, g_res = sk.ops.gemma_fused_add_rms_norm(x, r, w, eps)
    tol = TOLERANCE[dtype]
    assert rel_err(y, fp64_rms_norm(x, w, eps)) < tol
    assert rel_err(g, fp64_rms_norm(x, w, eps, 1.0)) < tol
    expected_res = (x.double() + r.double())
    assert rel_err(res, expected_res) < tol and torch.equal(res, g_res)
    assert rel_err(out, fp64_rms_norm(res, w, eps)) < tol
    assert rel_err(g_out, fp64_rms_norm(res, w, eps, 1.0)) < tol
    calls = sk.coverage.report()["kernel_calls"]
    assert calls["rms_norm"] == 1 and calls["gemma_rms_norm"] == 1 and calls["fused_add_rms_norm"] == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
def test_in_place_form_updates_both_buffers(dtype, gemma):
    x, r, w = inputs((7,), 1023, dtype)
    expected_out, expected_res = (sk.ops.gemma_fused_add_rms_norm if gemma else sk.ops.fused_add_rms_norm)(x, r, w)
    op = sk.ops.gemma_fused_add_rms_norm_ if gemma else sk.ops.fused_add_rms_norm_
    with sk.coverage.strict():
        assert op(x, r, w) is None
    assert torch.equal(r, expected_res)
    assert torch.equal(x, expected_out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(dtype):
    base, rbase, w = inputs((6,), 2 * 1023, dtype)
    x, r = base[::2, ::2], rbase[::2, ::2]  # strided rows and a strided last dim
    w = torch.cat([w, w])[: x.shape[-1]]
    cols = base[:, :1023]  # unit-stride rows with a row stride that is not the width
    wc = w[:1023]
    with sk.coverage.strict():
        y = sk.ops.rms_norm(x, w)
        yc = sk.ops.rms_norm(cols, wc)
        out, res = sk.ops.fused_add_rms_norm(x, r, w)
    assert rel_err(y, fp64_rms_norm(x, w, 1e-6)) < TOLERANCE[dtype]
    assert rel_err(yc, fp64_rms_norm(cols, wc, 1e-6)) < TOLERANCE[dtype]
    assert rel_err(out, fp64_rms_norm(res, w, 1e-6)) < TOLERANCE[dtype]
    # In place on views: the results land in the caller's (strided) storage.
    xv, rv = cols.clone()[:, :1000], base.clone()[:, :1000]
    expected_out, expected_res = sk.ops.fused_add_rms_norm(xv, rv, wc[:1000])
    sk.ops.fused_add_rms_norm_(xv, rv, wc[:1000])
    assert torch.equal(xv, expected_out) and torch.equal(rv, expected_res)
    # A strided weight (the kernels read it with unit stride: they get a contiguous copy).
    ws = torch.stack([w, poisoned_like(w)], dim=1)[:, 0]
    assert not ws.is_contiguous()
    with sk.coverage.strict():
        assert rel_err(sk.ops.rms_norm(x, ws), fp64_rms_norm(x, ws, 1e-6)) < TOLERANCE[dtype]
        assert rel_err(sk.ops.gemma_rms_norm(x, ws), fp64_rms_norm(x, ws, 1e-6, 1.0)) < TOLERANCE[dtype]
        out, res = sk.ops.fused_add_rms_norm(x, r, ws)
        assert rel_err(out, fp64_rms_norm(res, ws, 1e-6)) < TOLERANCE[dtype]
        xi, ri = x.clone(), r.clone()
        sk.ops.fused_add_rms_norm_(xi, ri, ws)
        assert torch.equal(xi, out) and torch.equal(ri, res)


def test_in_place_on_non_viewable_tensor_writes_back():
    x, r, w = inputs((4,), 64, torch.float32)
    xt, rt = x.t().contiguous().t(), r.t().contiguous().t()  # column-major: rows cannot be viewed
    expected_out, expected_res = sk.ops.fused_add_rms_norm(xt, rt, w)
    sk.ops.fused_add_rms_norm_(xt, rt, w)
    assert torch.equal(xt, expected_out) and torch.equal(rt, expected_res)


def test_empty_batch():
    x, r, w = inputs((0,), 4096, torch.float32)
    with sk.coverage.strict():
        assert sk.ops.rms_norm(x, w).shape == (0, 4096)
        out, res = sk.ops.fused_add_rms_norm(x, r, w)
        sk.ops.fused_add_rms_norm_(x, r, w)
    assert out.shape == res.shape == (0, 4096)


@pytest.mark.parametrize("lead", [(3,), (0,), (2, 0), (2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the kernel's path and the reference's
def test_width_zero_in_every_path(lead, dtype):
    x, r, w = (t.to(dtype) for t in inputs(lead, 0, torch.float32))
    kernel = dtype != torch.float64
    with sk.coverage.strict(kernel):
        y, g = sk.ops.rms_norm(x, w), sk.ops.gemma_rms_norm(x, w)
        out, res = sk.ops.fused_add_rms_norm(x, r, w)
        sk.ops.fused_add_rms_norm_(x, r, w)
        sk.ops.gemma_fused_add_rms_norm_(x, r, w)
        compiled = torch.compile(lambda x, r, w: sk.ops.fused_add_rms_norm(x, r, w), fullgraph=True,
                                 backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")(x, r, w)
    assert y.shape == g.shape == out.shape == res.shape == compiled[0].shape == (*lead, 0)
    assert (sk.coverage.report()["kernel_calls"].get("rms_norm", 0) > 0) == kernel
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    sk.ops.rms_norm(xg, wg).sum().backward()
    assert xg.grad.shape == xg.shape and wg.grad.shape == (0,)


@pytest.mark.parametrize("gemma", [False, True])
def test_in_place_form_trains_under_torch_compile(gemma):
    a, r0, w = (t.requires_grad_() for t in inputs((3,), 256, torch.float32))
    op = sk.ops.gemma_fused_add_rms_norm_ if gemma else sk.ops.fused_add_rms_norm_

    def block(a, r0, w):
        x, r = a * 2, r0 * 1
        op(x, r, w)
        return (x * x).sum() + (r * w).sum()

    block(a, r0, w).backward()
    eager = [t.grad.clone() for t in (a, r0, w)]
    for t in (a, r0, w):
        t.grad = None
    torch.compile(block, fullgraph=True, backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")(
        a, r0, w).backward()
    for t, expected in zip((a, r0, w), eager):
        assert rel_err(t.grad, expected) < 1e-6


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_in_place_form_under_torch_compile_without_grad_runs_the_kernel(mode):
    x, r, w = inputs((3,), 256, torch.float32)
    expected_out, expected_res = sk.ops.fused_add_rms_norm(x, r, w)
    with mode(), sk.coverage.strict():
        x, r = x.clone(), r.clone()
        compiled = torch.compile(lambda x, r, w: sk.ops.fused_add_rms_norm_(x, r, w), fullgraph=True,
                                 backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")
        compiled(x, r, w)
    assert torch.equal(x, expected_out) and torch.equal(r, expected_res)


def test_outputs_are_fully_written():
    x, r, w = inputs((5,), 1023, torch.float32)
    xi, ri = poisoned_like(x), poisoned_like(r)
    xi.copy_(x)
    ri.copy_(r)
    sk.ops.fused_add_rms_norm_(xi, ri, w)
    assert torch.isfinite(xi).all() and torch.isfinite(ri).all()
    assert torch.isfinite(sk.ops.rms_norm(x, w)).all()


# ----------------------------------------------------------------------------------------------- backward

VARIANTS = {  # name: (offset, fused)
    "rms_norm": (0.0, False), "gemma_rms_norm": (1.0, False),
    "fused_add_rms_norm": (0.0, True), "gemma_fused_add_rms_norm": (1.0, True),
}


def _norm_call(name, x, r, w, eps):
    op = getattr(sk.ops, name)
    return op(x, r, w, eps) if VARIANTS[name][1] else (op(x, w, eps),)


def fp64_norm_grads(name, x, r, w, cotangents, eps):
    """(dx, dresidual, dweight) by fp64 autograd of the formulas, and the scale of dx's terms: dx = rstd·(g − n·mean(g·n))
    cancels, to nothing at width 1, so its error is measured against ‖rstd·g‖ (+ ‖dresidual-output‖), the size of
    what is added (any fp32 evaluation of the formula errs by about u_fp32 of that)."""
    offset, fused = VARIANTS[name]
    w64 = w.detach().double().requires_grad_()
    if fused:  # what is normalized is x + residual rounded to the dtype, as the kernel does; d/dx = d/dresidual
        h = (x.detach().double() + r.detach().double()).to(x.dtype).double().requires_grad_()
    else:
        h = x.detach().double().requires_grad_()
    outputs = (fp64_rms_norm(h, w64, eps, offset), h)[: 2 if fused else 1]
    dh, dw = torch.autograd.grad(outputs, (h, w64), [c.double() for c in cotangents])
    rstd = torch.rsqrt((h.detach() ** 2).mean(-1, keepdim=True) + eps)
    scale = (rstd * cotangents[0].double() * (w64.detach() + offset)).norm().item()
    if fused:
        scale += cotangents[1].double().norm().item()
    return dh, dw, scale


# fp64 runs the reference in fp64: nothing but fp64 roundings.
BACKWARD_TOLERANCE = {**TOLERANCE, torch.float64: 1e-12}


def check_norm_backward(name, x, r, w, eps, strict=True, weight_grad=True):
    x = x.detach().requires_grad_()
    r = r.detach().requires_grad_()
    w = w.detach().requires_grad_(weight_grad)
    with sk.coverage.strict(strict):
        outputs = _norm_call(name, x, r, w, eps)
    gen = torch.Generator().manual_seed(seed_of("cotangent", name, tuple(x.shape), x.dtype))
    cotangents = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outputs]
    wrt = (x, r, w) if VARIANTS[name][1] else (x, w)
    with sk.coverage.strict(strict):
        grads = torch.autograd.grad(outputs, [t for t in wrt if t.requires_grad], cotangents)
    dh, dw, scale = fp64_norm_grads(name, x, r, w, cotangents, eps)
    got = dict(zip([n for n, t in zip(("x", "r", "w") if len(wrt) == 3 else ("x", "w"), wrt) if t.requires_grad],
                   grads))
    tol = BACKWARD_TOLERANCE[x.dtype]
    assert got["x"].dtype == x.dtype and got["x"].shape == x.shape
    assert (got["x"].double().cpu() - dh.cpu()).norm().item() <= tol * (scale or 1.0), name
    if "r" in got:
        assert torch.equal(got["r"], got["x"])
    if weight_grad:
        assert got["w"].dtype == w.dtype and got["w"].shape == w.shape
        assert rel_err(got["w"].cpu(), dw.cpu()) < BACKWARD_TOLERANCE[w.dtype], name
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", ODD_WIDTHS + REAL_WIDTHS)
def test_backward_kernels_match_fp64(n, dtype):
    x, r, w = inputs((2, 3), n, dtype)
    # FP32 master weights under fp16 activations at some widths, the activations' dtype at the others.
    w = w.float() if n in (3, 4097) else w
    for name in VARIANTS:
        check_norm_backward(name, x, r, w, 1e-5)
    calls = sk.coverage.report()["kernel_calls"]
    assert calls["rms_norm"] == 2 and calls["gemma_fused_add_rms_norm"] == 2  # forward and backward kernels


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 8192, 65536])
def test_bf16_backward_matches_fp64_on_gpu(n):
    x, r, w = inputs((64, 33), n, torch.bfloat16)
    for name in VARIANTS:
        check_norm_backward(name, x, r, w.float(), 1e-6)
        check_norm_backward(name, x, r, w, 1e-6)


def test_backward_pipeline_fits_in_shared_memory():
    # The buffered tiles stay within BACKWARD_PIPELINE_BYTES; 65536-wide bf16 rows (4 bytes of x and dy a column:
    # 256 KB a stage, past an H200's 227 KB a block) are not pipelined at all.
    module = importlib.import_module("sk.ops.rms_norm")  # sk.ops.rms_norm is the function
    budget, depth = module.BACKWARD_PIPELINE_BYTES, module.BACKWARD_NUM_STAGES
    assert module.backward_stages(1, 4096, 4) == depth
    assert module.backward_stages(1, 65536, 4) == 1 and module.backward_stages(1, 65536, 6) == 1
    for rows, block_n in [(1, 4096), (1, 8192), (1, 16384), (2, 1024), (16, 128), (1, 32768)]:
        for input_bytes in (4, 6, 8, 12):
            stages = module.backward_stages(rows, block_n, input_bytes)
            assert 1 <= stages <= depth
            assert stages == 1 or (stages - 1) * rows * block_n * input_bytes <= budget
            assert stages == depth or stages * rows * block_n * input_bytes > budget  # the deepest that fits


@pytest.mark.gpu
def test_weight_gradient_is_the_same_bits_on_every_run_on_gpu():
    x, r, w = inputs((32768,), 4096, torch.bfloat16)
    dy = torch.randn_like(x)
    runs = []
    for _ in range(3):
        wg = w.float().requires_grad_()
        out, res = sk.ops.fused_add_rms_norm(x, r, wg)
        torch.autograd.backward((out, res), (dy, dy))
        runs.append(wg.grad)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_backward_of_non_contiguous_inputs_and_gradients():
    base, rbase, w = inputs((6,), 2 * 1023, torch.float32)
    x, r = base[::2, ::2], rbase[::2, ::2]  # strided rows and a strided last dim
    w = torch.cat([w, w])[: x.shape[-1]]
    for name in VARIANTS:
        check_norm_backward(name, x, r, w, 1e-6)
    # Expanded cotangents (row stride 0), as `.sum().backward()` gives them
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    with sk.coverage.strict():
        sk.ops.rms_norm(xg, wg).sum().backward()
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    fp64_rms_norm(x64, w64, 1e-6).sum().backward()
    assert rel_err(wg.grad, w64.grad) < 1e-5 and torch.isfinite(xg.grad).all()
    # A strided weight: both gradients as with its contiguous copy.
    wbase = torch.stack([w, torch.full_like(w, float("nan"))], dim=1).requires_grad_()
    xg = x.detach().requires_grad_()
    with sk.coverage.strict():
        sk.ops.rms_norm(xg, wbase[:, 0]).sum().backward()
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    fp64_rms_norm(x64, w64, 1e-6).sum().backward()
    assert rel_err(xg.grad, x64.grad) < 1e-5 and rel_err(wbase.grad[:, 0], w64.grad) < 1e-5


def test_backward_of_an_empty_batch_gives_a_zero_weight_gradient():
    for name in VARIANTS:
        x, r, w = inputs((0,), 64, torch.float32)
        x.requires_grad_()
        w = poisoned_like(w).requires_grad_()
        with sk.coverage.strict():
            outputs = _norm_call(name, x, r, w, 1e-6)
            sum(o.sum() for o in outputs).backward()
        assert x.grad.shape == (0, 64) and torch.equal(w.grad, torch.zeros(64, device=w.device))


def test_input_gradient_only():
    x, r, w = inputs((5,), 1023, torch.float16)
    for name in VARIANTS:
        check_norm_backward(name, x, r, w, 1e-6, weight_grad=False)


def test_weight_gradient_is_the_same_bits_on_every_run():
    # More row tiles than programs: each program sums several tiles, then the partial rows are summed.
    x, r, w = inputs((97,), 1023, torch.float16)
    dy = torch.randn(97, 1023).to(x.device, x.dtype)
    runs = []
    for _ in range(2):
        wg = w.float().requires_grad_()
        with sk.coverage.strict():
            out, res = sk.ops.fused_add_rms_norm(x, r, wg)
            torch.autograd.backward((out, res), (dy, dy))
        runs.append(wg.grad)
    assert torch.equal(runs[0], runs[1])


def test_backward_fallback_is_recorded_and_matches_fp64():
    x, r, w = inputs((3,), 64, torch.float32)
    for name in VARIANTS:
        check_norm_backward(name, x.double(), r.double(), w.double(), 1e-6, strict=False)
    reasons = {f["reason"] for f in sk.coverage.report()["fallbacks"]}
    assert "backward: dtype fp64 is not covered (bf16, fp16, fp32)" in reasons
    # Strict in force where the backward runs (on CPU the calling thread runs it; on CUDA autograd's own threads
    # do, where only a strict forward carries over: tests/test_coverage.py).
    if x.device.type == "cpu":
        with sk.coverage.strict(), pytest.raises(sk.CoverageError, match="backward: dtype fp64"):
            xg = x.double().requires_grad_()
            with sk.coverage.strict(False):
                y = sk.ops.rms_norm(xg, w.double())
            y.sum().backward()


def test_backward_fallback_on_cpu_without_the_interpreter(settings_override):
    settings_override(triton_interpret=False)
    x, r, w = inputs((3,), 64, torch.float32, "cpu")
    for name in VARIANTS:
        check_norm_backward(name, x, r, w, 1e-6, strict=False)
    misses = [f for f in sk.coverage.report()["fallbacks"] if f["reason"].startswith("backward: CPU tensor")]
    assert {f["op"] for f in misses} == set(VARIANTS)


def test_torch_compile_fullgraph_forward_and_backward():
    x, r, w = inputs((3,), 256, torch.float32)

    def step(x, r, w):
        h, res = sk.ops.fused_add_rms_norm(x, r, w)
        return (sk.ops.gemma_rms_norm(h, w) * res).sum() + sk.ops.rms_norm(res, w).square().sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True,
                                   backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")):
        leaves = [t.clone().requires_grad_() for t in (x, r, w)]
        with sk.coverage.strict():
            fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for got, expected in zip(grads[1], grads[0]):
        assert torch.equal(got, expected)


def test_torch_compile_fullgraph():
    x, r, w = inputs((3,), 256, torch.float32)

    def block(x, r, w):
        h, res = sk.ops.fused_add_rms_norm(x, r, w)
        return sk.ops.silu_and_mul(torch.cat([h, sk.ops.gemma_rms_norm(res, w)], -1)), res

    compiled = torch.compile(block, fullgraph=True, backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")
    got, expected = compiled(x, r, w), block(x, r, w)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x, w: sk.ops.rms_norm(x, w[:-1]), r"weight must have shape \(N,\).*weight \(1022,\), x \(4, 1023\)"),
        (lambda x, w: sk.ops.rms_norm(x.long(), w), r"x has dtype torch.int64 \(shape \(4, 1023\)\)"),
        (lambda x, w: sk.ops.rms_norm(x, w, eps=-1.0), r"eps must be a non-negative float"),
        (lambda x, w: sk.ops.fused_add_rms_norm(x, x[:2], w), r"residual must match x"),
        (lambda x, w: sk.ops.rms_norm(x, "w"), r"weight must be a torch.Tensor"),
    ],
)
def test_bad_arguments_are_named(call, message):
    x, _, w = inputs((4,), 1023, torch.float32, "cpu")
    with pytest.raises((ValueError, TypeError), match=message):
        call(x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_graph_replay_with_new_inputs(dtype):
    x, r, w = inputs((32,), 4096, dtype, "cuda")
    static_x, static_r = x.clone(), r.clone()
    sk.warmup([4096], dtypes=[dtype])  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sk.ops.rms_norm(static_x, w)
        sk.ops.fused_add_rms_norm_(static_x, static_r, w)
    for _ in range(3):
        x, r, _ = inputs((32,), 4096, dtype, "cuda")
        x, r = x * torch.rand(()).item() * 3, r + 1  # fresh values
        static_x.copy_(x)
        static_r.copy_(r)
        graph.replay()
        expected_out, expected_res = fused_add_rms_norm_reference(x, r, w, 1e-6)
        assert rel_err(y, fp64_rms_norm(x, w, 1e-6)) < TOLERANCE[dtype]
        assert torch.equal(static_r, expected_res)
        assert rel_err(static_x, fp64_rms_norm(expected_res, w, 1e-6)) < TOLERANCE[dtype]


# ------------------------------------------------------------------------------- programmatic dependent launch

def test_dependent_launch_only_on_sm90_gpus_not_interpreted_and_switchable(monkeypatch):
    module = importlib.import_module("sk.ops.rms_norm")  # `sk.ops.rms_norm` is also the function's name
    seen = []
    monkeypatch.setattr(module, "_dependent_launch_capable", lambda index: seen.append(index) or index == 0)
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    with sk.settings.override(triton_interpret=False):
        assert module.dependent_launch(cuda0)
        assert not module.dependent_launch(cuda1)  # a GPU before SM90 (or ROCm)
        with sk.settings.override(norm_pdl=False):
            assert not module.dependent_launch(cuda0)
    with sk.settings.override(triton_interpret=True):  # no inline PTX in the interpreter
        assert not module.dependent_launch(cuda0)
    assert not module.dependent_launch(torch.device("cpu"))
    assert seen == [0, 1]


_PDL_COMPILE_CHECK = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sk.ops.rms_norm import _rms_norm_kernel

def ptx(pdl):
    signature = {name: "*bf16" for name in ("x_ptr", "res_ptr", "w_ptr", "y_ptr", "res_out_ptr")}
    signature.update({name: "i32" for name in ("x_stride", "res_stride", "y_stride", "res_out_stride", "n_rows",
                                               "n_cols")}, eps="fp32", weight_offset="fp32")
    constexprs = dict(HAS_RESIDUAL=True, ROWS_PER_PROGRAM=1, BLOCK_N=4096, PDL=pdl)
    return triton.compile(ASTSource(fn=_rms_norm_kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]

def first(pattern, text):
    found = re.search(pattern, text)
    return found.start() if found else None

on, off = ptx(True), ptx(False)
print(json.dumps({name: {"wait": first(r"griddepcontrol\.wait", text),
                         "launch": first(r"griddepcontrol\.launch_dependents", text),
                         "load": first(r"\bld\.global", text), "store": first(r"\bst\.global", text)}
                  for name, text in (("on", on), ("off", off))}))
"""


def test_dependent_launch_waits_before_touching_memory_in_the_sm90_code():
    """A dependent-launched norm starts while the kernel before it may still write x, the residual or the weight:
    compiled for sm90 (Triton's own ptxas, no GPU), its code waits for that kernel before its first global load
    or store, and lets the next kernel launch; without PDL it has neither instruction. Subprocess: without the
    interpreter."""
    from sm90_compile import run_compile_check

    found = run_compile_check(_PDL_COMPILE_CHECK)
    on, off = found["on"], found["off"]
    assert None not in on.values(), on
    assert on["wait"] < on["load"] and on["wait"] < on["store"] and on["launch"] < on["store"], on
    assert off["wait"] is None and off["launch"] is None and off["load"] is not None, off


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_dependent_launches_in_a_cuda_graph_read_what_the_kernel_before_wrote(dtype):
    """A decoder's chain in one graph: a producer kernel writes h, then eight in-place add + norms each read the
    one before's outputs (dependent launch after dependent launch), then a plain norm and a GEMM. The same bits
    as the chain launched in plain stream order, and the fp64 chain's answer."""
    from sk.ops.rms_norm import dependent_launch

    layers, rows, n = 8, 32, 4096
    weights = [inputs((rows,), n, dtype, "cuda")[2] * (1 + 0.01 * i) for i in range(layers)]
    proj = torch.randn(n, n, device="cuda", dtype=dtype) / n ** 0.5

    def chain(source, h, res):
        torch.mul(source, 2.0, out=h)  # the producer: a plain kernel writing h right before the first norm
        for wi in weights:
            sk.ops.fused_add_rms_norm_(h, res, wi)
        return torch.mm(sk.ops.rms_norm(h, weights[0]), proj)

    results = {}
    for pdl in (True, False):
        with sk.settings.override(norm_pdl=pdl):
            assert dependent_launch(proj.device) == (pdl and torch.cuda.get_device_capability() >= (9, 0))
            x, r, _ = inputs((rows,), n, dtype, "cuda")
            source, h, res = x.clone(), torch.empty_like(x), r.clone()
            chain(source, h, res.clone())  # compiles every kernel before capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = chain(source, h, res)
            for replay in range(3):
                fresh_x, fresh_r, _ = inputs((replay + 2, rows), n, dtype, "cuda")  # fresh values each replay
                fresh_x, fresh_r = fresh_x[0] * (replay + 1), fresh_r[0]
                source.copy_(fresh_x)
                res.copy_(fresh_r)
                h.fill_(float("nan"))  # poisoned: a norm reading h before the producer wrote it shows
                graph.replay()
                results[pdl, replay] = (out.clone(), h.clone(), res.clone(), fresh_x, fresh_r)
    for replay in range(3):
        on, off = results[True, replay], results[False, replay]
        for a, b in zip(on[:3], off[:3]):
            assert torch.equal(a, b), replay
        want_h, want_res = on[3].double() * 2, on[4].double()
        for wi in weights:
            want_res = want_h + want_res
            want_h = fp64_rms_norm(want_res, wi, 1e-6)
        want_out = fp64_rms_norm(want_h, weights[0], 1e-6) @ proj.double()
        # Nine roundings (eight layers' and the GEMM's), independent: their errors grow as √9 = 3 times one's.
        assert rel_err(on[0], want_out) < 3 * TOLERANCE[dtype], replay
        assert rel_err(on[2], want_res) < 3 * TOLERANCE[dtype], replay


def test_custom_ops_and_their_backward_pass_opcheck():
    """torch.library's schema, fake, and AOT-dispatch (autograd formula) checks, with gradients wanted."""
    x, r, w = inputs((3,), 64, torch.float32)
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    torch.library.opcheck(torch.ops.sk.rms_norm.default, (xg, wg, 1e-6, 1.0))
    torch.library.opcheck(torch.ops.sk.fused_add_rms_norm.default, (xg, rg, wg, 1e-6, 0.0))
    torch.library.opcheck(torch.ops.sk.rms_norm_backward.default, (r, x, w, None, 1e-6, 0.0, False, True))
    torch.library.opcheck(torch.ops.sk.rms_norm_backward.default, (r, x, w, r.clone(), 1e-6, 1.0, True, False))
