"""RMSNorm family: reference against fp64 math, kernel against the reference, in-place forms, edge cases."""
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


def test_gradients_match_reference_and_backward_is_recorded():
    x, r, w = inputs((3,), 64, torch.float32)
    x.requires_grad_(True)
    w.requires_grad_(True)
    sk.ops.rms_norm(x, w).square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    fp64_rms_norm(x, w, 1e-6).square().sum().backward()
    assert rel_err(gx, x.grad) < 1e-5 and rel_err(gw, w.grad) < 1e-5
    reasons = [f["reason"] for f in sk.coverage.report()["fallbacks"]]
    assert any(reason.startswith("backward:") for reason in reasons)


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
