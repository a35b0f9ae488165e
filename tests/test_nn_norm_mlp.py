"""sk.nn.RMSNorm / GemmaRMSNorm / GatedMLP / PreNorm*FFN: forward against fp64, the residual form, and
`from_module` on Hugging Face's own classes (built tiny on CPU), with clear refusals."""
import pytest
import torch
from torch import nn

import sk
from numerics import KERNEL_DEVICE, TOLERANCE, fp64_act_and_mul, rel_err, seed_of

transformers = pytest.importorskip("transformers")
from transformers.activations import ACT2FN  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as HFGemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402


def fp64_rms_norm(x, w, eps, offset=0.0):
    x, w = x.double(), w.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (w + offset)


def randomized(module, scale=0.1):
    torch.manual_seed(seed_of(type(module).__name__))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


@pytest.mark.parametrize("source, target, offset", [
    (LlamaRMSNorm(40, eps=1e-5), sk.nn.RMSNorm, 0.0),
    (Qwen3RMSNorm(40, eps=1e-6), sk.nn.RMSNorm, 0.0),
    (HFGemmaRMSNorm(40, eps=1e-6), sk.nn.GemmaRMSNorm, 1.0),
])
def test_norm_from_hugging_face_module(source, target, offset):
    source = randomized(source)
    ours = target.from_module(source).to(KERNEL_DEVICE)
    eps = getattr(source, "variance_epsilon", getattr(source, "eps", None))
    assert ours.eps == eps and ours.weight.dtype == torch.float32 and torch.equal(ours.weight.cpu(), source.weight)
    x = torch.randn(3, 40)
    with torch.no_grad(), sk.coverage.strict():
        got = ours(x.to(KERNEL_DEVICE))
    assert rel_err(got.cpu(), fp64_rms_norm(x, source.weight, eps, offset)) < TOLERANCE[torch.float32]
    assert rel_err(got.cpu(), source(x)) < TOLERANCE[torch.float32]


def test_norm_from_module_keeps_the_dtype_or_makes_fp32_masters():
    source = randomized(LlamaRMSNorm(16)).to(torch.bfloat16)
    assert sk.nn.RMSNorm.from_module(source).weight.dtype == torch.bfloat16
    assert sk.nn.RMSNorm.from_module(source, dtype=torch.float32).weight.dtype == torch.float32


@pytest.mark.parametrize("make, cls, message", [
    (lambda: randomized(HFGemmaRMSNorm(16)), sk.nn.RMSNorm, r"computes x·rstd·\(1 \+ weight\); use sk.nn.GemmaRMSNorm"),
    (lambda: randomized(LlamaRMSNorm(16)), sk.nn.GemmaRMSNorm, r"computes x·rstd·weight; use sk.nn.RMSNorm"),
    (lambda: nn.LayerNorm(16), sk.nn.RMSNorm, r"parameters besides `weight` \(\['bias'\]\)"),
    (lambda: nn.Linear(16, 16), sk.nn.RMSNorm, r"no 1-D `weight`"),
    (lambda: nn.LayerNorm(16, bias=False), sk.nn.RMSNorm, r"computes neither x·rstd·weight"),
])
def test_norm_from_module_refuses_what_does_not_fit(make, cls, message):
    with pytest.raises(ValueError, match=message):
        cls.from_module(make())


def test_norm_residual_form_is_the_engines_fused_add():
    norm = randomized(sk.nn.GemmaRMSNorm(33)).to(KERNEL_DEVICE)
    x, r = torch.randn(2, 4, 33, device=KERNEL_DEVICE), torch.randn(2, 4, 33, device=KERNEL_DEVICE)
    with sk.coverage.strict():
        out, res = norm(x, r)
    assert torch.equal(res, x + r)
    assert rel_err(out.cpu(), fp64_rms_norm((x + r).cpu(), norm.weight.detach().cpu(), 1e-6, 1.0)) < 1e-5


class _Config:
    def __init__(self, act, bias=False):
        self.hidden_size, self.intermediate_size, self.hidden_act, self.mlp_bias = 24, 40, act, bias


def _fp64_mlp(module, x, activation):
    g, u = x.double() @ module.gate_proj.weight.double().t(), x.double() @ module.up_proj.weight.double().t()
    if module.gate_proj.bias is not None:
        g, u = g + module.gate_proj.bias.double(), u + module.up_proj.bias.double()
    y = fp64_act_and_mul(torch.cat([g, u], -1), activation) @ module.down_proj.weight.double().t()
    return y + module.down_proj.bias.double() if module.down_proj.bias is not None else y


@pytest.mark.parametrize("act, activation, bias", [("silu", "silu", False), ("gelu_pytorch_tanh", "gelu_tanh", True),
                                                   ("gelu", "gelu", False)])
def test_gated_mlp_from_llama_mlp(act, activation, bias):
    source = randomized(LlamaMLP(_Config(act, bias)))
    ours = sk.nn.GatedMLP.from_module(source).to(KERNEL_DEVICE)
    assert ours.activation == activation and (ours.gate_proj.bias is not None) == bias
    assert ours.state_dict().keys() == source.state_dict().keys()
    x = torch.randn(5, 24)
    with torch.no_grad(), sk.coverage.strict():
        got = ours(x.to(KERNEL_DEVICE))
    assert rel_err(got.cpu(), _fp64_mlp(source, x, activation)) < 1e-5


def test_gated_mlp_bf16_compute_on_fp32_masters():
    mlp = randomized(sk.nn.GatedMLP(24, 40)).to(KERNEL_DEVICE)
    x = torch.randn(6, 24, device=KERNEL_DEVICE).to(torch.bfloat16).requires_grad_()
    with sk.coverage.strict():
        y = mlp(x)
        y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert all(p.grad.dtype == torch.float32 for p in mlp.parameters())
    # bf16 GEMM inputs and outputs: a few bf16 roundings (u = 3.9e-3) per element
    assert rel_err(y.float().cpu(), _fp64_mlp(mlp.cpu(), x.detach().float().cpu(), "silu")) < 2e-2


@pytest.mark.parametrize("mutate, message", [
    (lambda m: setattr(m, "act_fn", ACT2FN["quick_gelu"]), r"cannot tell LlamaMLP's activation: act_fn is QuickGELU"),
    (lambda m: delattr(m, "gate_proj"), r"no Linear child 'gate_proj'"),
    (lambda m: setattr(m, "down_proj", nn.Linear(40, 23, bias=False)), r"do not form a gated MLP"),
])
def test_gated_mlp_from_module_refuses_what_does_not_fit(mutate, message):
    source = LlamaMLP(_Config("silu"))
    mutate(source)
    with pytest.raises(ValueError, match=message):
        sk.nn.GatedMLP.from_module(source)
    with pytest.raises(ValueError, match=r"activation='gelu' given but LlamaMLP.act_fn computes 'silu'"):
        sk.nn.GatedMLP.from_module(LlamaMLP(_Config("silu")), activation="gelu")


def test_pre_norm_swiglu_ffn_from_a_decoder_layers_modules():
    norm, mlp = randomized(LlamaRMSNorm(24)), randomized(LlamaMLP(_Config("silu")))
    block = sk.nn.PreNormSwiGLUFFN.from_modules(norm, mlp).to(KERNEL_DEVICE)
    x = torch.randn(4, 24)
    with torch.no_grad(), sk.coverage.strict():
        got = block(x.to(KERNEL_DEVICE))
    assert rel_err(got.cpu(), x.double() + _fp64_mlp(mlp, fp64_rms_norm(x, norm.weight, 1e-6), "silu")) < 1e-5
    with pytest.raises(ValueError, match=r"activation is 'gelu_tanh', not SiLU; use sk.nn.PreNormGatedFFN"):
        sk.nn.PreNormSwiGLUFFN.from_modules(norm, LlamaMLP(_Config("gelu_pytorch_tanh")))
    gemma = sk.nn.PreNormGatedFFN.from_modules(HFGemmaRMSNorm(24), LlamaMLP(_Config("gelu_pytorch_tanh")))
    assert isinstance(gemma.norm, sk.nn.GemmaRMSNorm) and gemma.mlp.activation == "gelu_tanh"


def test_gated_mlp_inference_reuses_its_weight_copies_until_a_master_changes():
    mlp = randomized(sk.nn.GatedMLP(24, 40, bias=True)).to(KERNEL_DEVICE)
    x = torch.randn(5, 24, device=KERNEL_DEVICE).half()
    with torch.no_grad():
        first = mlp(x)
        held = sk.ops.weight_cache.size_bytes()
        assert held >= (2 * 40 * 24 + 24 * 40) * 2  # [gate; up] and down in fp16, made once
        assert torch.equal(mlp(x), first) and sk.ops.weight_cache.size_bytes() == held
        mlp.up_proj.weight.mul_(2)  # an optimizer-style in-place update is seen
        second = mlp(x)
    # fp16 GEMM inputs and outputs: a few fp16 roundings (u = 4.9e-4) per element
    assert rel_err(second.float().cpu(), _fp64_mlp(mlp.cpu(), x.float().cpu(), "silu")) < 4e-3
    assert not torch.equal(second, first)


@pytest.mark.skipif(KERNEL_DEVICE == "cpu" and not sk.settings.get("triton_interpret"), reason="needs the kernels")
@pytest.mark.parametrize("gemma, activation, m", [(False, "silu", 5), (True, "gelu_tanh", 3), (False, "silu", 40)])
def test_pre_norm_gated_ffn_inference_in_half_precision_is_one_fused_call(gemma, activation, m):
    block = sk.nn.PreNormGatedFFN(24, 40, activation=activation, gemma_norm=gemma).to(KERNEL_DEVICE)
    randomized(block)
    x = torch.randn(m, 24, device=KERNEL_DEVICE)
    with torch.no_grad(), sk.coverage.strict():
        got = block(x.half())
    offset, x = (1.0 if gemma else 0.0), x.cpu()
    want = x.double() + _fp64_mlp(block.mlp.cpu(), fp64_rms_norm(x.half().float(), block.norm.weight.cpu(), 1e-6,
                                                                 offset), activation)
    # fp16 (u = 4.9e-4): the op's 2e-3 (tests/test_fused_gated_mlp.py) plus the residual add's rounding
    assert got.dtype == torch.float16 and rel_err(got.float().cpu(), want) < 3e-3
    calls = sk.coverage.report()["kernel_calls"]
    name = "fused_gated_mlp/" + ("gemma_rms" if gemma else "rms")
    assert calls.get(name) == 1, calls
    if m <= sk.ops.gated_mlp.triton_kernels.fused_max_m(24, 40):
        assert set(calls) == {name}, calls  # norm, GEMMs and activation inside the one op


def test_modules_under_torch_compile_fullgraph_forward_and_backward():
    norm, mlp = randomized(sk.nn.GemmaRMSNorm(24)).to(KERNEL_DEVICE), randomized(sk.nn.GatedMLP(24, 40)).to(KERNEL_DEVICE)

    def step(x, r):
        h, res = norm(x, r)
        return (mlp(h) + res).square().sum()

    x, r = torch.randn(5, 24, device=KERNEL_DEVICE), torch.randn(5, 24, device=KERNEL_DEVICE)
    grads = []
    for fn in (step, torch.compile(step, fullgraph=True,
                                   backend="inductor" if KERNEL_DEVICE == "cuda" else "aot_eager")):
        norm.zero_grad()
        mlp.zero_grad()
        leaves = [x.clone().requires_grad_(), r.clone().requires_grad_()]
        with sk.coverage.strict():
            fn(*leaves).backward()
        grads.append([t.grad for t in leaves] + [p.grad.clone() for p in (*norm.parameters(), *mlp.parameters())])
    for got, want in zip(grads[1], grads[0]):
        assert rel_err(got.cpu(), want.cpu()) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
def test_training_step_replayed_from_cuda_graphs(residual):
    """torch.cuda.make_graphed_callables over our norm and MLP: forward and backward captured (our backward
    kernels inside the graphs), replayed with fresh inputs, the same gradients as eager calls."""
    sk.warmup([256], [512], dtypes=[torch.bfloat16], training=True)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.mlp = sk.nn.RMSNorm(256), sk.nn.GatedMLP(256, 512)

        def forward(self, x, r):
            if residual:
                h, r = self.norm(x, r)
                return self.mlp(h) + r
            return self.mlp(self.norm(x)) + r

    torch.manual_seed(0)
    eager = randomized(Block()).cuda()
    graphed_block = randomized(Block()).cuda()
    graphed_block.load_state_dict(eager.state_dict())

    def sample():
        return [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2)]
    graphed = torch.cuda.make_graphed_callables(graphed_block, tuple(sample()))
    for _ in range(3):
        inputs = sample()
        twins = [t.detach().clone().requires_grad_() for t in inputs]
        dy = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        with sk.coverage.strict():
            graphed(*inputs).backward(dy)
            eager(*twins).backward(dy)
        for a, b in zip(inputs + list(graphed_block.parameters()), twins + list(eager.parameters())):
            assert torch.equal(a.grad, b.grad)
        graphed_block.zero_grad()
        eager.zero_grad()


@pytest.mark.skipif(KERNEL_DEVICE == "cpu" and not sk.settings.get("triton_interpret"), reason="needs the kernels")
def test_pre_norm_gated_ffn_under_autocast_keeps_the_fp32_residual_in_every_grad_mode():
    # An fp32 x under fp16 autocast: the MLP computes in fp16 on both paths, the residual stream stays fp32.
    block = randomized(sk.nn.PreNormGatedFFN(24, 40)).to(KERNEL_DEVICE)
    x = torch.randn(3, 24, device=KERNEL_DEVICE) * 10 + 100
    with torch.autocast(KERNEL_DEVICE, dtype=torch.float16):
        trained = block(x)
        with torch.no_grad():
            inferred = block(x)
    assert trained.dtype == inferred.dtype == torch.float32
    # Both add an fp16 MLP output to the same fp32 x: they differ by the MLP's roundings alone (fp16, ~|mlp|·4u).
    mlp_size = (trained - x).abs().max().item()
    assert (trained - inferred).abs().max().item() <= 4 * 4.9e-4 * mlp_size + 1e-6
