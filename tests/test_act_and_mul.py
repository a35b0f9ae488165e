"""Gated activations: reference against fp64 math, kernel against the reference, `out=`, edge cases."""

import pytest
import torch

import sk
from numerics import (DTYPES, KERNEL_DEVICE, ODD_WIDTHS, REAL_WIDTHS, TOLERANCE, fp64_act_and_mul, poisoned_like,
                      rel_err, seed_of)
from sk.ops.act_and_mul import act_and_mul_reference

WIDTHS = ODD_WIDTHS + ([14336] if REAL_WIDTHS else [])
ACTIVATIONS = {
    "silu": lambda x: sk.ops.silu_and_mul(x),
    "gelu": lambda x: sk.ops.gelu_and_mul(x),
    "gelu_tanh": lambda x: sk.ops.gelu_and_mul(x, approximate="tanh"),
}


def inputs(lead, d, dtype, device=KERNEL_DEVICE):
    g = torch.Generator().manual_seed(seed_of(lead, d, dtype))
    return (2 * torch.randn(*lead, 2 * d, generator=g)).to(device, dtype)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_fp64_math(activation, dtype):
    x = inputs((5,), 1023, dtype, "cpu")
    assert rel_err(act_and_mul_reference(x, activation), fp64_act_and_mul(x, activation)) < TOLERANCE[dtype]


def check_forward(x, activation):
    """The kernel's output (strict: no fallback) against fp64, within the dtype's tolerance."""
    with sk.coverage.strict():
        y = ACTIVATIONS[activation](x)
    assert y.shape == (*x.shape[:-1], x.shape[-1] // 2) and y.dtype == x.dtype
    want = fp64_act_and_mul(x, activation)
    # The kernel's erf (Abramowitz & Stegun 7.1.26) is within 1.5e-7 of erf, so an output may be off by
    # 0.75e-7·|g·u| on top of its rounding: large relative to y = g·Φ(g)·u in GELU's negative tail, where
    # 1 + erf cancels (as in PyTorch's own fp32 gelu, at libdevice's accuracy). That slack is allowed.
    g, u = x.double().chunk(2, dim=-1)
    erf_slack = 0.75e-7 * (g * u).norm().item() if activation == "gelu" else 0.0
    assert (y.double() - want).norm().item() <= TOLERANCE[x.dtype] * want.norm().item() + erf_slack


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", WIDTHS)
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5)])
def test_kernel_matches_reference(lead, d, dtype, activation):
    check_forward(inputs(lead, d, dtype), activation)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_large_problem_launch_with_a_width_past_one_block(activation):
    # Past SMALL_PROBLEM outputs SiLU's forward takes blocks of up to LARGE_BLOCK columns (the GELUs 2048, the
    # backwards their own): 64 rows of 16385 is just past it, and a second block holds one live column.
    from sk.ops.act_and_mul import LARGE_BLOCK, SMALL_PROBLEM
    rows, d = 64, LARGE_BLOCK + 1
    assert rows * d > SMALL_PROBLEM
    x = inputs((rows,), d, torch.float32)
    check_forward(x, activation)
    check_backward(x, activation)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_argument_is_written_and_returned(dtype):
    x = inputs((7,), 1023, dtype)
    out = poisoned_like(x[..., :1023])
    with sk.coverage.strict():
        got = sk.ops.gelu_and_mul(x, approximate="tanh", out=out)
    assert got is out and torch.isfinite(out).all()
    assert rel_err(out, fp64_act_and_mul(x, "gelu_tanh")) < TOLERANCE[dtype]


def test_non_contiguous_input_and_out():
    base = inputs((6,), 2 * 1023, torch.float32)
    x = base[::2, : 2 * 1023]  # row stride 4 * 1023: unit-stride rows, not the width
    out = poisoned_like(base)[::2, :1023]
    with sk.coverage.strict():
        sk.ops.silu_and_mul(x, out=out)
        y_t = sk.ops.silu_and_mul(x.t().contiguous().t())  # column-major input
    expected = fp64_act_and_mul(x, "silu")
    assert rel_err(out, expected) < TOLERANCE[torch.float32]
    assert rel_err(y_t, expected) < TOLERANCE[torch.float32]


def test_empty_batch():
    x = inputs((0,), 64, torch.float32)
    with sk.coverage.strict():
        assert sk.ops.silu_and_mul(x).shape == (0, 64)
        assert sk.ops.gelu_and_mul(x, out=x.new_empty(0, 64)).shape == (0, 64)


@pytest.mark.parametrize("lead", [(3,), (0,), (2, 0), (2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the kernel's path and the reference's
def test_width_zero_in_every_path(lead, dtype):
    x = torch.empty(*lead, 0, dtype=dtype, device=KERNEL_DEVICE)
    kernel = dtype != torch.float64
    with sk.coverage.strict(kernel):
        for act in ACTIVATIONS.values():
            assert act(x).shape == (*lead, 0)
        assert sk.ops.gelu_and_mul(x, out=x.new_empty(*lead, 0)).shape == (*lead, 0)
        compiled = torch.compile(lambda x: sk.ops.silu_and_mul(x), fullgraph=True,
                                 backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")
        assert compiled(x).shape == (*lead, 0)
    assert (sk.coverage.report()["kernel_calls"].get("silu_and_mul", 0) > 0) == kernel
    xg = x.clone().requires_grad_()
    sk.ops.silu_and_mul(xg).sum().backward()
    assert xg.grad.shape == xg.shape


# ----------------------------------------------------------------------------------------------- backward

def fp64_act_grad(x, dy, activation):
    x64 = x.detach().double().requires_grad_()
    (dx,) = torch.autograd.grad(fp64_act_and_mul(x64, activation), (x64,), dy.double())
    return dx


def check_backward(x, activation, dtype_tolerance=None, strict=True):
    x = x.detach().requires_grad_()
    with sk.coverage.strict(strict):
        y = ACTIVATIONS[activation](x)
        gen = torch.Generator().manual_seed(seed_of("cotangent", tuple(x.shape), x.dtype, activation))
        dy = torch.randn(y.shape, generator=gen).to(y.device, y.dtype)
        (dx,) = torch.autograd.grad(y, (x,), dy)
    want = fp64_act_grad(x, dy, activation)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    # dx = [dy·u·act'(g), dy·act(g)], each rounded once from fp32; the kernel's erf (A&S 7.1.26, |error| < 1.5e-7)
    # moves Φ(g) by up to 0.75e-7, i.e. each half by 0.75e-7·|dy·u| and 0.75e-7·|dy·g|: allowed on top.
    g, u = x.detach().double().cpu().chunk(2, dim=-1)
    dy64 = dy.double().cpu()
    erf_slack = 0.75e-7 * ((dy64 * u).norm() + (dy64 * g).norm()).item() if activation == "gelu" else 0.0
    tol = dtype_tolerance or TOLERANCE[x.dtype]
    assert (dx.double().cpu() - want.cpu()).norm().item() <= tol * want.norm().item() + erf_slack, activation
    return dx


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d", WIDTHS)
def test_backward_kernel_matches_fp64(d, dtype):
    x = inputs((2, 3), d, dtype)
    for activation in ACTIVATIONS:
        check_backward(x, activation)
    calls = sk.coverage.report()["kernel_calls"]
    assert calls["silu_and_mul"] == 2 and calls["gelu_and_mul"] == 4  # forward and backward kernels


@pytest.mark.gpu
def test_bf16_backward_matches_fp64_on_gpu():
    x = inputs((4096,), 14336, torch.bfloat16, "cuda")
    for activation in ACTIVATIONS:
        check_backward(x, activation)


def test_backward_of_non_contiguous_input_and_empty_batch():
    base = inputs((6,), 2 * 1023, torch.float32)
    for x in (base[::2, : 2 * 1023], base[:, ::2], base.t().contiguous().t()[:, :2046]):
        check_backward(x, "silu")
    x = inputs((0,), 64, torch.float32).requires_grad_()
    with sk.coverage.strict():
        sk.ops.gelu_and_mul(x).sum().backward()
    assert x.grad.shape == (0, 128)


def test_backward_fallback_is_recorded_and_matches_fp64(settings_override):
    x = inputs((3,), 64, torch.float32)
    for activation in ACTIVATIONS:
        check_backward(x.double(), activation, dtype_tolerance=1e-12, strict=False)
    settings_override(triton_interpret=False)
    for activation in ACTIVATIONS:
        check_backward(x.cpu(), activation, strict=False)
    reasons = [(f["op"], f["reason"]) for f in sk.coverage.report()["fallbacks"]]
    assert ("gelu_and_mul", "backward: dtype fp64 is not covered (bf16, fp16, fp32)") in reasons
    assert any(op == "silu_and_mul" and reason.startswith("backward: CPU tensor") for op, reason in reasons)


def test_torch_compile_fullgraph_forward_and_backward():
    x = inputs((5,), 96, torch.float32)

    def step(x):
        return (sk.ops.silu_and_mul(x) * sk.ops.gelu_and_mul(x, approximate="tanh")).sum() + sk.ops.gelu_and_mul(x).sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True,
                                   backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")):
        leaf = x.clone().requires_grad_()
        with sk.coverage.strict():
            fn(leaf).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: sk.ops.silu_and_mul(x[..., :-1]), r"last dimension must be even.*\(4, 2045\)"),
        (lambda x: sk.ops.gelu_and_mul(x, approximate="fast"), r"approximate must be 'none' or 'tanh', got 'fast'"),
        (lambda x: sk.ops.silu_and_mul(x, out=x), r"out must have shape \(4, 1023\) and dtype torch.float32; got \(4, 2046\)"),
        (lambda x: sk.ops.silu_and_mul(x, out=x[:, :1023].half()), r"out must have shape .* got \(4, 1023\) torch.float16"),
        (lambda x: sk.ops.silu_and_mul(x.int()), r"x has dtype torch.int32"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(inputs((4,), 1023, torch.float32, "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda_graph_replay_with_new_inputs(activation):
    static_x = inputs((16,), 14336, torch.bfloat16, "cuda")
    out = torch.empty(16, 14336, dtype=torch.bfloat16, device="cuda")
    sk.warmup(intermediate_sizes=[14336])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ACTIVATIONS[activation](static_x)
        sk.ops.silu_and_mul(static_x, out=out)
    for scale in (0.5, 1.0, 3.0):
        x = inputs((16,), 14336, torch.bfloat16, "cuda") * scale
        static_x.copy_(x)
        graph.replay()
        assert rel_err(y, fp64_act_and_mul(x, activation)) < TOLERANCE[torch.bfloat16]
        assert rel_err(out, fp64_act_and_mul(x, "silu")) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_torch_compile_inductor_on_gpu():
    x = inputs((33,), 14336, torch.bfloat16, "cuda")
    w = torch.randn(14336, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda x: sk.ops.rms_norm(sk.ops.gelu_and_mul(x, approximate="tanh"), w), fullgraph=True)
    with sk.coverage.strict():
        assert torch.equal(fn(x), sk.ops.rms_norm(sk.ops.gelu_and_mul(x, approximate="tanh"), w))


def test_custom_op_and_its_backward_pass_opcheck():
    """torch.library's schema, fake, and AOT-dispatch (autograd formula) checks, with a gradient wanted."""
    x = inputs((3,), 32, torch.float32)
    torch.library.opcheck(torch.ops.sk.act_and_mul.default, (x.clone().requires_grad_(), "gelu_tanh"))
    torch.library.opcheck(torch.ops.sk.act_and_mul_backward.default, (x[:, :32].contiguous(), x, "silu"))
