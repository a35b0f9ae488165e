"""PreNormGEGLUFFN: FP32 masters, from_module (found by name, explicit, errors), BF16 copies refreshed after
optimizer steps and not re-made otherwise, autocast, the FP32 fallback, and training on CPU and GPU."""
import importlib

import pytest
import torch

import sk
from numerics import KERNEL_DEVICE, rel_err
from sk.nn import PreNormGEGLUFFN
# The seed page's block, and (autouse) bf16 on CPU taking the PyTorch fallback: Triton's interpreter multiplies
# bf16 wrongly, so the kernels are tested interpreted in fp32/fp16 in test_fused_pre_norm_geglu.py.
from test_seed_getting_started import MyGEGLUBlock, _cpu_takes_the_fallback  # noqa: F401

geglu = importlib.import_module("sk.ops.gated_mlp.geglu")


def randomized(block):
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return block


def test_defaults_are_fp32_masters_with_seed_sizes():
    block = PreNormGEGLUFFN()
    assert (block.d_model, block.d_ff, block.eps) == (768, 1448, 1e-5)
    assert all(p.dtype == torch.float32 for p in block.parameters())
    assert block.gate.weight.shape == (1448, 768) and block.down.weight.shape == (768, 1448)


def test_from_module_round_trips_the_seed_block_exactly():
    source = randomized(MyGEGLUBlock(64, 96))
    block = PreNormGEGLUFFN.from_module(source)
    pairs = {"norm": "my_norm", "gate": "my_gate", "up": "my_up", "down": "my_down"}
    for ours, theirs in pairs.items():
        for attr in ("weight", "bias"):
            assert torch.equal(getattr(getattr(block, ours), attr), getattr(getattr(source, theirs), attr))
    assert (block.d_model, block.d_ff, block.eps) == (64, 96, source.eps)
    x = torch.randn(5, 64, dtype=torch.float64)
    assert rel_err(block.double()(x), source.double()(x)) < 1e-14  # fallback path in fp64: same function


def test_from_module_lands_on_the_source_device():
    source = MyGEGLUBlock(32, 48).to(KERNEL_DEVICE)
    assert PreNormGEGLUFFN.from_module(source).gate.weight.device == source.my_gate.weight.device


def test_from_module_with_explicit_names_and_missing_biases():
    class Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(16)
            self.w1 = torch.nn.Linear(16, 24, bias=False)
            self.w3 = torch.nn.Linear(16, 24, bias=False)
            self.w2 = torch.nn.Linear(24, 16)
    source = randomized(Other())
    block = PreNormGEGLUFFN.from_module(source, norm="ln", gate="w1", up="w3", down="w2")
    assert block.gate.bias is None and block.up.bias is None and torch.equal(block.down.bias, source.w2.bias)
    assert torch.equal(block.up.weight, source.w3.weight)
    x = torch.randn(3, 16)
    h = source.ln(x)
    want = x + source.w2(torch.nn.functional.gelu(source.w1(h)) * source.w3(h))
    assert rel_err(block(x), want) < 1e-5


def test_from_module_errors_name_what_was_found():
    class TwoGates(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.gate_a, self.gate_b = torch.nn.Linear(8, 12), torch.nn.Linear(8, 12)
            self.up, self.down = torch.nn.Linear(8, 12), torch.nn.Linear(12, 8)
    with pytest.raises(ValueError, match=r"which child of TwoGates is the gate.*2 match \(gate_a, gate_b\).*gate="):
        PreNormGEGLUFFN.from_module(TwoGates())
    with pytest.raises(ValueError, match=r"down='nope' must name a Linear child of TwoGates.*no such child"):
        PreNormGEGLUFFN.from_module(TwoGates(), gate="gate_a", down="nope")
    mismatched = MyGEGLUBlock(8, 12)
    mismatched.my_down = torch.nn.Linear(10, 8)
    with pytest.raises(ValueError, match=r"do not form a GEGLU block.*down Linear\(in=10, out=8\)"):
        PreNormGEGLUFFN.from_module(mismatched)


def test_bf16_copies_follow_optimizer_steps_and_are_not_remade_otherwise():
    block = PreNormGEGLUFFN(16, 24).to(KERNEL_DEVICE)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.5)
    x = torch.randn(4, 16, device=KERNEL_DEVICE).to(torch.bfloat16)
    block(x).float().sum().backward()
    copy = geglu.compute_weight(block.gate.weight, torch.bfloat16)
    block(x)
    assert geglu.compute_weight(block.gate.weight, torch.bfloat16) is copy  # no re-cast while unchanged
    optimizer.step()
    fresh = geglu.compute_weight(block.gate.weight, torch.bfloat16)
    assert fresh is not copy and torch.equal(fresh, block.gate.weight.detach().to(torch.bfloat16))


def test_the_forward_sees_replaced_children_parametrized_weights_and_functional_call():
    block = randomized(PreNormGEGLUFFN(16, 24)).to(KERNEL_DEVICE)
    x = torch.randn(3, 16, device=KERNEL_DEVICE)

    def expected(gate_weight):
        return geglu.fused_pre_norm_geglu_reference(
            x, block.norm.weight, block.norm.bias, gate_weight, block.gate.bias, block.up.weight, block.up.bias,
            block.down.weight, block.down.bias, block.eps, "none")
    with torch.no_grad():
        doubled = 2 * block.gate.weight
        got = torch.func.functional_call(block, {"gate.weight": doubled}, (x,))
        assert rel_err(got, expected(doubled)) < 1e-6
        assert rel_err(block(x), expected(block.gate.weight)) < 1e-6  # the module's own weights again

        class Halved(torch.nn.Module):
            def forward(self, w):
                return w / 2
        torch.nn.utils.parametrize.register_parametrization(block.gate, "weight", Halved())
        assert rel_err(block(x), expected(block.gate.weight)) < 1e-6
        block.gate = torch.nn.Linear(16, 24).to(KERNEL_DEVICE)
        assert rel_err(block(x), expected(block.gate.weight)) < 1e-6
        del block.up.weight
        with pytest.raises(AttributeError, match="weight"):
            block(x)


def test_fp32_input_outside_autocast_takes_the_recorded_fallback():
    block = PreNormGEGLUFFN(16, 24).to(KERNEL_DEVICE)
    x = torch.randn(3, 16, device=KERNEL_DEVICE)
    assert block(x).dtype == torch.float32
    (miss,) = sk.coverage.report()["fallbacks"]
    assert miss["op"] == "fused_pre_norm_geglu" and miss["dtypes"][0] == "fp32"
    assert "fp32" in miss["reason"] or KERNEL_DEVICE == "cpu"  # on CPU the device is named first
    with sk.coverage.strict(), pytest.raises(sk.CoverageError):
        block(x)


def test_training_reaches_the_fp32_masters_and_lowers_the_loss():
    torch.manual_seed(0)
    block = PreNormGEGLUFFN(32, 48).to(KERNEL_DEVICE)
    optimizer = torch.optim.AdamW(block.parameters(), lr=1e-2)
    x = torch.randn(16, 32, device=KERNEL_DEVICE).to(torch.bfloat16)
    target = torch.randn(16, 32, device=KERNEL_DEVICE)
    losses = []
    for _ in range(8):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(block(x).float(), target)
        loss.backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in block.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.gpu
def test_gpu_autocast_converts_fp32_input_and_runs_the_kernel():
    block = PreNormGEGLUFFN().cuda()
    x = torch.randn(1024, 768, device="cuda")
    with sk.coverage.strict(), torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(x)
    assert y.dtype == torch.bfloat16
    want = block.double()(x.to(torch.bfloat16).double())
    assert rel_err(y, want) < 1e-2  # bf16 forward tolerance, as in test_fused_pre_norm_geglu


@pytest.mark.gpu
def test_gpu_training_matches_the_seed_block_under_autocast():
    torch.manual_seed(0)
    source = randomized(MyGEGLUBlock()).cuda()
    ours = PreNormGEGLUFFN.from_module(source)
    x = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    with sk.coverage.strict():
        ours(x).backward(dy)
    source64 = MyGEGLUBlock().cuda().double()
    source64.load_state_dict(source.state_dict())
    source64(x.double()).backward(dy.double())
    for (name, p), p64 in zip(ours.named_parameters(), source64.parameters()):
        assert p.grad.dtype == torch.float32
        assert rel_err(p.grad, p64.grad) < 2e-2, name  # bf16 gradient tolerance (test_fused_pre_norm_geglu)
