"""Autograd audit: backward through every public op in `sk.ops` and every `sk.nn` module, against autograd of fp64
math; in-place forms give correct gradients (or torch's refusals), `out=` forms refuse autograd as torch's do.

A new public op or module without an entry in AUDIT / MODULES fails `test_every_public_op_and_module_is_audited`.
"""
import contextlib
import inspect
import math

import pytest
import torch
import torch.utils._python_dispatch

import sk
from numerics import KERNEL_DEVICE, fp64_act_and_mul, rel_err, seed_of

EPS = 1e-6
# fp32 forward and fp32 backward vs fp64: a few roundings (u = 6e-8) per element plus row sums of <= 1023 terms
# (about sqrt(n)·u = 2e-6 at worst); measured <= 3e-7; 1e-5 is numerics.TOLERANCE[fp32].
OP_TOLERANCE = 1e-5
# The GEGLU block adds three fp32 GEMMs and the LayerNorm backward's row sums to that chain; measured <= 7e-7.
BLOCK_TOLERANCE = 2e-5


# ----------------------------------------------------------------------------------------------- fp64 math

def fp64_rms_norm(x, w, offset=0.0):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * (w + offset)


def fp64_pre_norm_geglu(x, ln_w, ln_b, wg, bg, wu, bu, wd, bd, eps=1e-5, approximate="none"):
    mean = x.mean(-1, keepdim=True)
    xn = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps) * ln_w
    xn = xn + ln_b if ln_b is not None else xn
    g, u = xn @ wg.t(), xn @ wu.t()
    g, u = (g + bg if bg is not None else g), (u + bu if bu is not None else u)
    h = fp64_act_and_mul(torch.cat([g, u], -1), "gelu_tanh" if approximate == "tanh" else "gelu")
    down = h @ wd.t()
    return x + (down + bd if bd is not None else down)


# ----------------------------------------------------------------------------------------------- audit entries
# An entry: (leaf shapes of (lead, n), the op on the leaves, fp64 math on them); leaf 0 goes through `view` in both.

def _norm_entry(name):
    offset = 1.0 if name.startswith("gemma") else 0.0
    op = getattr(sk.ops, name)
    if "fused_add" not in name:  # rms_norm, gemma_rms_norm: (x, weight)
        return ([lambda lead, n: (*lead, n), lambda lead, n: (n,)],
                lambda view, x, w: (op(view(x), w, EPS),),
                lambda view, x, w: (fp64_rms_norm(view(x), w, offset),))
    shapes = [lambda lead, n: (*lead, n), lambda lead, n: (*lead, n), lambda lead, n: (n,)]
    in_place = name.endswith("_")

    def call(view, x, r, w):
        if not in_place:
            return op(view(x), r, w, EPS)
        xb, rb = view(2 * x), 1 * r  # in-place forms write into non-leaf buffers, as a model's activations are
        assert op(xb, rb, w, EPS) is None
        return xb, rb

    def fp64(view, x, r, w):
        h = (view(2 * x) if in_place else view(x)) + r
        return fp64_rms_norm(h, w, offset), h
    return shapes, call, fp64


def _act_entry(name, **kwargs):
    op = getattr(sk.ops, name)
    activation = "silu" if name == "silu_and_mul" else "gelu_tanh" if kwargs.get("approximate") == "tanh" else "gelu"
    return ([lambda lead, n: (*lead, 2 * n)],
            lambda view, x: (op(view(x), **kwargs),),
            lambda view, x: (fp64_act_and_mul(view(x), activation),))


def _geglu_entry(approximate, bias=True):
    def ff(n):
        return n + 5  # d_ff unlike d_model, and odd

    shapes = [lambda lead, n: (*lead, n), lambda lead, n: (n,), lambda lead, n: (n,),
              lambda lead, n: (ff(n), n), lambda lead, n: (ff(n),), lambda lead, n: (ff(n), n),
              lambda lead, n: (ff(n),), lambda lead, n: (n, ff(n)), lambda lead, n: (n,)]

    def biases(args):
        x, ln_w, ln_b, wg, bg, wu, bu, wd, bd = args
        return (x, ln_w, ln_b, wg, bg, wu, bu, wd, bd) if bias else (x, ln_w, None, wg, None, wu, None, wd, None)

    def call(view, *args):
        x, *rest = biases(args)
        return (sk.ops.fused_pre_norm_geglu(view(x), *rest, 1e-5, approximate),)

    def fp64(view, *args):
        x, *rest = biases(args)
        return (fp64_pre_norm_geglu(view(x), *rest, 1e-5, approximate),)
    return shapes, call, fp64


def _gated_mlp_entry(norm, activation, residual):
    """fused_gated_mlp: leaves x, norm weight (and bias for "layer"), merged gate/up [2·d_ff, n], down, residual."""
    def ff(n):
        return n + 3  # d_ff unlike d_model, and odd

    shapes = [lambda lead, n: (*lead, n), lambda lead, n: (n,), lambda lead, n: (2 * ff(n), n),
              lambda lead, n: (n, ff(n))]
    if norm == "layer":
        shapes.append(lambda lead, n: (n,))
    if residual:
        shapes.append(lambda lead, n: (*lead, n))

    def split(args):
        x, w, wgu, wd, *rest = args
        bias = rest.pop(0) if norm == "layer" else None
        return x, w, wgu, wd, bias, (rest[0] if residual else None)

    def call(view, *args):
        x, w, wgu, wd, bias, r = split(args)
        return sk.ops.fused_gated_mlp(view(x), w, wgu, wd, EPS, residual=r, norm=norm, activation=activation,
                                      norm_bias=bias)

    def fp64(view, *args):
        x, w, wgu, wd, bias, r = split(args)
        h = view(x) + r if residual else view(x)
        if norm == "layer":
            mean = h.mean(-1, keepdim=True)
            n = (h - mean) / torch.sqrt(((h - mean) ** 2).mean(-1, keepdim=True) + EPS) * w + bias
        else:
            n = fp64_rms_norm(h, w, 1.0 if norm == "gemma_rms" else 0.0)
        return fp64_act_and_mul(n @ wgu.t(), activation) @ wd.t(), h
    return shapes, call, fp64


def _linear_entry(bias):
    """linear: leaves x, weight [n_out, n] (n_out unlike n, and odd) and the bias."""
    def n_out(n):
        return n + 5
    shapes = [lambda lead, n: (*lead, n), lambda lead, n: (n_out(n), n)] + ([lambda lead, n: (n_out(n),)] if bias
                                                                             else [])

    def call(view, x, w, *b):
        return (sk.ops.linear(view(x), w, *b),)

    def fp64(view, x, w, *b):
        return (view(x) @ w.t() + (b[0] if b else 0),)
    return shapes, call, fp64


# Every public op of sk.ops, with each variant its arguments select.
AUDIT = {
    "rms_norm": [_norm_entry("rms_norm")],
    "gemma_rms_norm": [_norm_entry("gemma_rms_norm")],
    "fused_add_rms_norm": [_norm_entry("fused_add_rms_norm")],
    "gemma_fused_add_rms_norm": [_norm_entry("gemma_fused_add_rms_norm")],
    "fused_add_rms_norm_": [_norm_entry("fused_add_rms_norm_")],
    "gemma_fused_add_rms_norm_": [_norm_entry("gemma_fused_add_rms_norm_")],
    "silu_and_mul": [_act_entry("silu_and_mul")],
    "gelu_and_mul": [_act_entry("gelu_and_mul"), _act_entry("gelu_and_mul", approximate="tanh")],
    "fused_pre_norm_geglu": [_geglu_entry("none"), _geglu_entry("tanh", bias=False)],
    "fused_gated_mlp": [_gated_mlp_entry("rms", "silu", residual=True),
                        _gated_mlp_entry("gemma_rms", "gelu_tanh", residual=False),
                        _gated_mlp_entry("layer", "gelu", residual=True)],
    "linear": [_linear_entry(bias=True), _linear_entry(bias=False)],
}
# Every public module of sk.nn (audited below).
MODULES = {"PreNormGEGLUFFN", "RMSNorm", "GemmaRMSNorm", "GatedMLP", "PreNormGatedFFN", "PreNormSwiGLUFFN"}

# The activation as the op sees it: contiguous; a strided last dim; transposed (column-major rows).
VIEWS = {
    "contiguous": (lambda shape: shape, lambda t: t),
    "strided": (lambda shape: (*shape[:-1], 2 * shape[-1]), lambda t: t[..., ::2]),
    "transposed": (lambda shape: tuple(reversed(shape)), lambda t: t.transpose(0, -1)),
}


def _public(module, kind):
    return {n for n in dir(module) if not n.startswith("_") and kind(getattr(module, n))}


def test_every_public_op_and_module_is_audited():
    ops = _public(sk.ops, inspect.isfunction)
    assert ops == set(AUDIT) == set(sk.ops.__all__), f"audit entries missing for {ops - set(AUDIT)}"
    modules = _public(sk.nn, lambda v: inspect.isclass(v) and issubclass(v, torch.nn.Module))
    exported = {n for n in sk.nn.__all__ if inspect.isclass(getattr(sk.nn, n))
                and issubclass(getattr(sk.nn, n), torch.nn.Module)}
    assert modules == MODULES == exported, f"audit entries missing for {modules - MODULES}"


def _draw(case, shapes):
    """Fresh normal draws per case: the activation plain, vectors (norm scales, biases) near 1, matrices scaled by
    1/sqrt(fan-in) as initialized layers are, so every case is well conditioned."""
    gen = torch.Generator().manual_seed(seed_of(*case))
    draws = [torch.randn(s, generator=gen) for s in shapes]
    return [d if not i else 1 + 0.1 * d if d.dim() == 1 else d / math.sqrt(d.shape[-1]) for i, d in enumerate(draws)]


def _grads(outputs, leaves, cotangents):
    return torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True)


@pytest.mark.parametrize("layout", list(VIEWS))
@pytest.mark.parametrize("lead, n", [((3,), 3), ((2, 3), 1023), ((4,), 64)])
@pytest.mark.parametrize("name, variant", [(n, i) for n, entries in AUDIT.items() for i in range(len(entries))])
def test_gradients_match_fp64_autograd(name, variant, lead, n, layout):
    shapes_of, call, fp64 = AUDIT[name][variant]
    if name == "fused_pre_norm_geglu" and n > 64:
        n = 24  # the block's GEMMs: kept small for the CPU
    grow, view = VIEWS[layout]
    shapes = [shape_of(lead, n) for shape_of in shapes_of]
    shapes[0] = grow(shapes[0])
    values = _draw((name, variant, lead, n, layout), shapes)
    leaves = [v.to(KERNEL_DEVICE).requires_grad_() for v in values]
    leaves64 = [v.double().requires_grad_() for v in values]
    outputs = call(view, *leaves)
    expected = fp64(view, *leaves64)
    gen = torch.Generator().manual_seed(seed_of("cotangent", name, variant, lead, n, layout))
    cotangents = [torch.randn(e.shape, generator=gen, dtype=torch.float64) for e in expected]
    tolerance = BLOCK_TOLERANCE if name == "fused_pre_norm_geglu" else OP_TOLERANCE
    for o, e in zip(outputs, expected):
        assert o.shape == e.shape and rel_err(o.cpu(), e) < tolerance
    got = _grads(outputs, leaves, [c.to(o.dtype).to(o.device) for c, o in zip(cotangents, outputs)])
    want = _grads(expected, leaves64, cotangents)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:  # an input this variant does not use (the bias-free GEGLU's biases)
            assert g is None, f"{name}: a gradient for unused input {i}"
            continue
        assert g is not None and g.shape == w.shape, f"{name}: no gradient for input {i}"
        assert rel_err(g.cpu(), w) < tolerance, f"{name}: input {i} gradient off by {rel_err(g.cpu(), w):.2e}"


@pytest.mark.parametrize("approximate, bias", [("none", True), ("tanh", False)])
@pytest.mark.parametrize("d, ff", [(3, 5), (16, 40)])
def test_module_gradients_match_fp64_autograd(d, ff, approximate, bias):
    torch.manual_seed(seed_of("PreNormGEGLUFFN", d, ff, approximate, bias))
    block = sk.nn.PreNormGEGLUFFN(d, ff, bias=bias, approximate=approximate).to(KERNEL_DEVICE)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(7, d, 2, device=KERNEL_DEVICE)[..., 0].requires_grad_()  # strided rows
    dy = torch.randn(7, d, dtype=torch.float64)
    (block(x) * dy.float().to(x.device)).sum().backward()
    named = dict(block.named_parameters())
    p64 = {k: v.detach().cpu().double().requires_grad_() for k, v in named.items()}
    x64 = x.detach().cpu().double().requires_grad_()

    def get(role, kind):
        return p64.get(f"{role}.{kind}")

    y64 = fp64_pre_norm_geglu(x64, get("norm", "weight"), get("norm", "bias"), get("gate", "weight"),
                              get("gate", "bias"), get("up", "weight"), get("up", "bias"), get("down", "weight"),
                              get("down", "bias"), block.eps, approximate)
    (y64 * dy).sum().backward()
    assert rel_err(x.grad.cpu(), x64.grad) < BLOCK_TOLERANCE
    for k, p in named.items():
        assert p.grad is not None and p.grad.dtype == torch.float32, k
        assert rel_err(p.grad.cpu(), p64[k].grad) < BLOCK_TOLERANCE, k


def _fp64_gated_mlp(x, p, activation, prefix=""):
    g = x @ p[f"{prefix}gate_proj.weight"].t()
    u = x @ p[f"{prefix}up_proj.weight"].t()
    return fp64_act_and_mul(torch.cat([g, u], -1), activation) @ p[f"{prefix}down_proj.weight"].t()


NN_CASES = {
    "RMSNorm": (lambda: sk.nn.RMSNorm(13), lambda x, p: fp64_rms_norm(x, p["weight"])),
    "GemmaRMSNorm": (lambda: sk.nn.GemmaRMSNorm(13), lambda x, p: fp64_rms_norm(x, p["weight"], 1.0)),
    "GatedMLP": (lambda: sk.nn.GatedMLP(13, 21, "gelu_tanh"), lambda x, p: _fp64_gated_mlp(x, p, "gelu_tanh")),
    "PreNormGatedFFN": (lambda: sk.nn.PreNormGatedFFN(13, 21, activation="gelu", gemma_norm=True),
                        lambda x, p: x + _fp64_gated_mlp(fp64_rms_norm(x, p["norm.weight"], 1.0), p, "gelu", "mlp.")),
    "PreNormSwiGLUFFN": (lambda: sk.nn.PreNormSwiGLUFFN(13, 21),
                         lambda x, p: x + _fp64_gated_mlp(fp64_rms_norm(x, p["norm.weight"]), p, "silu", "mlp.")),
}


@pytest.mark.parametrize("name", list(NN_CASES))
def test_norm_and_gated_mlp_module_gradients_match_fp64_autograd(name):
    make, fp64 = NN_CASES[name]
    torch.manual_seed(seed_of("module", name))
    module = make().to(KERNEL_DEVICE)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 5, 13, 2, device=KERNEL_DEVICE)[..., 0].requires_grad_()  # strided rows
    dy = torch.randn(2, 5, 13, dtype=torch.float64)
    with sk.coverage.strict():
        (module(x) * dy.float().to(x.device)).sum().backward()
    named = dict(module.named_parameters())
    p64 = {k: v.detach().cpu().double().requires_grad_() for k, v in named.items()}
    x64 = x.detach().cpu().double().requires_grad_()
    (fp64(x64, p64) * dy).sum().backward()
    assert rel_err(x.grad.cpu(), x64.grad) < OP_TOLERANCE
    for k, p in named.items():
        assert p.grad is not None and p.grad.dtype == torch.float32, k
        assert rel_err(p.grad.cpu(), p64[k].grad) < OP_TOLERANCE, k


@pytest.mark.parametrize("gemma", [False, True])
def test_norm_module_residual_form_gradients_match_fp64_autograd(gemma):
    torch.manual_seed(seed_of("module residual", gemma))
    norm = (sk.nn.GemmaRMSNorm if gemma else sk.nn.RMSNorm)(64).to(KERNEL_DEVICE)
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn(64).to(KERNEL_DEVICE))
    x, r = (torch.randn(7, 64, device=KERNEL_DEVICE).requires_grad_() for _ in range(2))
    dy, dr = torch.randn(7, 64, dtype=torch.float64), torch.randn(7, 64, dtype=torch.float64)
    with sk.coverage.strict():
        out, res = norm(x, r)
        torch.autograd.backward((out, res), (dy.float().to(x.device), dr.float().to(x.device)))
    x64, r64, w64 = (t.detach().cpu().double().requires_grad_() for t in (x, r, norm.weight))
    h = x64 + r64
    torch.autograd.backward((fp64_rms_norm(h, w64, 1.0 if gemma else 0.0), h), (dy, dr))
    for got, want in ((x.grad, x64.grad), (r.grad, r64.grad), (norm.weight.grad, w64.grad)):
        assert rel_err(got.cpu(), want) < OP_TOLERANCE


# ----------------------------------------------------------------------------------------------- in-place and out=

IN_PLACE = ["fused_add_rms_norm_", "gemma_fused_add_rms_norm_"]


def _norm_inputs(n=64, rows=3):
    gen = torch.Generator().manual_seed(seed_of("in-place", n, rows))
    x, r = (torch.randn(rows, n, generator=gen).to(KERNEL_DEVICE) for _ in range(2))
    return x, r, (1 + 0.1 * torch.randn(n, generator=gen)).to(KERNEL_DEVICE)


@pytest.mark.parametrize("name", IN_PLACE)
def test_issue_example_in_place_gradient_is_not_the_stale_one(name):
    a, r, w = _norm_inputs()
    r0 = r.clone()  # the op overwrites r
    a.requires_grad_()
    x = a * 2
    getattr(sk.ops, name)(x, r, w, EPS)
    x.sum().backward()
    a64 = a.detach().double().requires_grad_()
    fp64_rms_norm(2 * a64 + r0.double(), w.double(), 1.0 if name.startswith("gemma") else 0.0).sum().backward()
    assert not torch.allclose(a.grad, torch.full_like(a.grad, 2.0))
    assert rel_err(a.grad, a64.grad) < OP_TOLERANCE


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_with_only_the_weight_requiring_grad(name):
    x, r, w = _norm_inputs()
    x0, r0 = x.clone(), r.clone()
    w.requires_grad_()
    getattr(sk.ops, name)(x, r, w, EPS)
    assert x.requires_grad and not x.is_leaf  # the write is in x's history now, as torch's in-place ops record it
    (x * r).sum().backward()
    w64 = w.detach().double().requires_grad_()
    h = x0.double() + r0.double()
    (fp64_rms_norm(h, w64, 1.0 if name.startswith("gemma") else 0.0) * h).sum().backward()
    assert rel_err(w.grad, w64.grad) < OP_TOLERANCE


@pytest.mark.parametrize("name", IN_PLACE)
@pytest.mark.parametrize("target", ["x", "residual"])
@pytest.mark.parametrize("as_view", [False, True])
def test_in_place_into_a_leaf_that_requires_grad_is_refused_as_torch_refuses(name, target, as_view):
    x, r, w = _norm_inputs()
    leaf = {"x": x, "residual": r}[target].requires_grad_()
    x_in, r_in = (t[:, :32] if as_view else t for t in (x, r))
    before = (x.detach().clone(), r.detach().clone())
    with pytest.raises(RuntimeError) as torch_refusal:
        (leaf[:, :32] if as_view else leaf).add_(1)
    what = "a view of a leaf tensor that requires grad" if as_view else "a leaf tensor that requires grad"
    assert ("view of a leaf" in str(torch_refusal.value)) == as_view
    with pytest.raises(RuntimeError, match=rf"sk.ops.{name}: {target} is {what} \(shape \(3, 32\)\)" if as_view
                       else rf"sk.ops.{name}: {target} is {what} \(shape \(3, 64\)\).*{name.removesuffix('_')}"):
        getattr(sk.ops, name)(x_in, r_in, w[:32] if as_view else w, EPS)
    assert torch.equal(x.detach(), before[0]) and torch.equal(r.detach(), before[1])  # nothing written
    with torch.no_grad():  # as torch allows (an optimizer's update): no gradient is recorded
        getattr(sk.ops, name)(x_in, r_in, w[:32] if as_view else w, EPS)
    assert not torch.equal(x.detach(), before[0])


def test_raw_in_place_op_refuses_a_wanted_gradient():
    a, r, w = _norm_inputs()
    x = a.requires_grad_() * 2
    with pytest.raises(RuntimeError, match=r"sk::fused_add_rms_norm_: x requires grad .* without recording"):
        torch.ops.sk.fused_add_rms_norm_(x, r, w, EPS, 0.0)
    with torch.no_grad():
        torch.ops.sk.fused_add_rms_norm_(x, r, w, EPS, 0.0)  # without a gradient wanted: as before


def test_mutating_ops_keep_their_registration_checks_without_a_gradient():
    """The replaced Autograd kernel still passes torch.library's schema, fake and AOT-dispatch checks."""
    x, r, w = _norm_inputs()
    torch.library.opcheck(torch.ops.sk.fused_add_rms_norm_.default, (x, r, w, EPS, 1.0))
    torch.library.opcheck(torch.ops.sk.act_and_mul_out.default, (torch.empty(3, 32, device=KERNEL_DEVICE), x, "gelu"))


@pytest.mark.parametrize("call", [
    lambda x, out: sk.ops.silu_and_mul(x, out=out),
    lambda x, out: sk.ops.gelu_and_mul(x, out=out),
    lambda x, out: sk.ops.gelu_and_mul(x, approximate="tanh", out=out),
])
@pytest.mark.parametrize("wants", ["x", "out"])
def test_out_forms_refuse_autograd_as_torch_does(call, wants):
    x = torch.randn(3, 6, device=KERNEL_DEVICE)
    out = torch.zeros(3, 3, device=KERNEL_DEVICE)
    x_in, out_in = (x.requires_grad_(), out) if wants == "x" else (x, out.requires_grad_() * 1)
    with pytest.raises(RuntimeError, match=rf"out=\.\.\. does not support automatic differentiation.*{wants} requires grad"):
        call(x_in, out_in)
    with pytest.raises(RuntimeError, match=r"sk::act_and_mul_out: .*requires grad"):
        torch.ops.sk.act_and_mul_out(out_in, x_in, "silu")
    with torch.no_grad():
        assert call(x_in, out_in) is out_in


# ----------------------------------------------------------------------------------------------- eager path

class _PassThrough(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each op it sees and runs it: with a dispatch mode active the ops keep torch.library's dispatch."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


EAGER_CALLS = {
    "rms_norm": lambda x, r, w: (sk.ops.rms_norm(x, w, EPS),),
    "gemma_rms_norm": lambda x, r, w: (sk.ops.gemma_rms_norm(x, w, EPS),),
    "fused_add_rms_norm": lambda x, r, w: sk.ops.fused_add_rms_norm(x, r, w, EPS),
    "silu_and_mul": lambda x, r, w: (sk.ops.silu_and_mul(torch.cat([x, r], -1)),),
    "gelu_and_mul": lambda x, r, w: (sk.ops.gelu_and_mul(torch.cat([x, r], -1), approximate="tanh"),),
}


@pytest.mark.parametrize("name", EAGER_CALLS)
def test_eager_training_calls_skip_the_custom_op_dispatch_with_the_same_bits(name):
    # A plain eager training call runs the op's implementation as an autograd.Function (no torch.library
    # dispatch); under a dispatch mode the custom op runs instead. Same kernels: the same bits either way.
    gen = torch.Generator().manual_seed(seed_of("eager", name))
    x, r = (torch.randn(5, 33, generator=gen).to(KERNEL_DEVICE) for _ in range(2))
    w = (1 + 0.1 * torch.randn(33, generator=gen)).to(KERNEL_DEVICE)

    def run(mode):
        leaves = [t.clone().requires_grad_() for t in (x, r, w)]
        with mode:
            outputs = EAGER_CALLS[name](*leaves)
            cotangents = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(o.device)
                          for i, o in enumerate(outputs)]
            torch.autograd.backward(outputs, cotangents)
        return outputs, [t.grad for t in leaves]

    mode = _PassThrough()
    fast, fast_grads = run(contextlib.nullcontext())
    dispatched, dispatched_grads = run(mode)
    assert type(fast[0].grad_fn).__name__.endswith("_functionBackward")
    assert not type(dispatched[0].grad_fn).__name__.endswith("_functionBackward")
    assert any(op.startswith("sk.") for op in mode.ops), mode.ops  # the custom ops ran under the mode
    for a, b in zip(fast, dispatched):
        assert torch.equal(a, b)
    for a, b in zip(fast_grads, dispatched_grads):
        assert (a is None and b is None) or torch.equal(a, b)
    with torch.no_grad():
        assert EAGER_CALLS[name](x, r, w)[0].grad_fn is None


@pytest.mark.parametrize("name", EAGER_CALLS)
def test_eager_inference_calls_skip_the_dispatch_with_the_same_bits(name):
    # Without a gradient wanted, a plain eager call runs the implementation itself; under a dispatch mode the
    # op's dispatch runs instead (the mode sees it). Same kernels: the same bits either way.
    gen = torch.Generator().manual_seed(seed_of("eager inference", name))
    x, r = (torch.randn(5, 33, generator=gen).to(KERNEL_DEVICE) for _ in range(2))
    w = (1 + 0.1 * torch.randn(33, generator=gen)).to(KERNEL_DEVICE)
    mode = _PassThrough()
    with torch.no_grad():
        fast = EAGER_CALLS[name](x, r, w)
        with mode:
            dispatched = EAGER_CALLS[name](x, r, w)
    assert any(op.startswith("sk.") for op in mode.ops), mode.ops
    for a, b in zip(fast, dispatched):
        assert torch.equal(a, b)


def test_in_place_forms_without_the_dispatch_still_advance_the_version_counters():
    # What the dispatch of an op that writes into its arguments does, the direct eager call does too: autograd's
    # checks of saved tensors and sk.ops.weight_cache read the counters.
    x, r = torch.randn(3, 64).to(KERNEL_DEVICE), torch.randn(3, 64).to(KERNEL_DEVICE)
    before = (x._version, r._version)
    with torch.no_grad():
        sk.ops.fused_add_rms_norm_(x, r, torch.ones(64).to(KERNEL_DEVICE))
    assert x._version > before[0] and r._version > before[1]
    out = torch.empty(3, 32).to(KERNEL_DEVICE)
    before = out._version
    sk.ops.silu_and_mul(torch.randn(3, 64).to(KERNEL_DEVICE), out=out)
    assert out._version > before
    mode = _PassThrough()
    with mode, torch.no_grad():  # and so does the dispatch of the ops, registered through torch.library.Library
        before = (x._version, r._version)
        sk.ops.fused_add_rms_norm_(x, r, torch.ones(64).to(KERNEL_DEVICE))
    assert "sk.fused_add_rms_norm_.default" in mode.ops and x._version > before[0] and r._version > before[1]
