"""The "Getting Started" page's snippets, end to end, under both package names.

On a CUDA machine they run verbatim (device "cuda"). On CPU the device strings become "cpu" and every call
takes the recorded PyTorch fallback (Triton's interpreter is switched off for these tests: it is for testing
kernels on small inputs, and cannot run bf16 matrix products correctly), which the page promises is a
mathematically correct replacement.
"""
import json

import pytest
import torch

import sk
import standardkernels
from numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _cpu_takes_the_fallback(settings_override):
    if DEVICE == "cpu":
        settings_override(triton_interpret=False)


class MyGEGLUBlock(torch.nn.Module):
    def __init__(self, d_model=768, d_ff=1448, eps=1e-5):
        super().__init__()
        self.my_norm = torch.nn.LayerNorm(d_model, eps=eps)
        self.my_gate = torch.nn.Linear(d_model, d_ff)
        self.my_up = torch.nn.Linear(d_model, d_ff)
        self.my_down = torch.nn.Linear(d_ff, d_model)
        self.eps = eps

    def forward(self, x):
        h = self.my_norm(x)
        return x + self.my_down(torch.nn.functional.gelu(self.my_gate(h)) * self.my_up(h))


class MyFusedGEGLUBlock(MyGEGLUBlock):
    """Method 1: the same block with forward() rewritten as the page's diff shows."""

    def forward(self, x):
        return standardkernels.ops.fused_pre_norm_geglu(
            x,
            self.my_norm.weight, self.my_norm.bias,
            self.my_gate.weight, self.my_gate.bias,
            self.my_up.weight, self.my_up.bias,
            self.my_down.weight, self.my_down.bias,
            self.eps,
        )


class MyModel(torch.nn.Module):
    """The page leaves MyModel to the reader: an embedding-free stack around the FFN will do."""

    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(768, 768)
        self.ffn = MyGEGLUBlock()
        self.proj_out = torch.nn.Linear(768, 768)

    def forward(self, x):
        return self.proj_out(self.ffn(self.proj_in(x)))


def test_both_names_are_one_package():
    from standardkernels.nn import PreNormGEGLUFFN
    assert standardkernels is sk and PreNormGEGLUFFN is sk.nn.PreNormGEGLUFFN
    assert standardkernels.ops.fused_pre_norm_geglu is sk.ops.fused_pre_norm_geglu


def test_method_1_custom_module_with_the_op_inference(tmp_path):
    torch.manual_seed(0)
    block = MyFusedGEGLUBlock().to(DEVICE)

    # Inference
    block.eval()
    with torch.inference_mode():
        x = torch.randn(1024, 768, device=DEVICE, dtype=torch.bfloat16)
        output = block(x)

    assert output.shape == (1024, 768) and output.dtype == torch.bfloat16
    with torch.inference_mode():
        want = MyGEGLUBlock.forward(block.double(), x.double())
    assert rel_err(output, want) < 1e-2  # bf16 forward tolerance (tests/test_fused_pre_norm_geglu.py)

    report = standardkernels.coverage.write_report(tmp_path / "standardkernels-coverage.json")
    assert json.loads((tmp_path / "standardkernels-coverage.json").read_text()) == report
    if DEVICE == "cpu":
        (miss,) = report["fallbacks"]
        assert miss["op"] == "fused_pre_norm_geglu" and miss["shapes"][0] == [1024, 768]
        assert "CPU" in miss["reason"] and miss["dtypes"][0] == "bf16"
    else:
        assert report["kernel_calls"]["fused_pre_norm_geglu"] == 1 and not report["fallbacks"]


def test_method_2_prebuilt_module_inference_and_strict_mode():
    from standardkernels.nn import PreNormGEGLUFFN

    block = PreNormGEGLUFFN().to(DEVICE)

    # Inference
    block.eval()
    with torch.inference_mode():
        x = torch.randn(1024, 768, device=DEVICE, dtype=torch.bfloat16)
        output = block(x)
    assert output.shape == (1024, 768)

    # x is an inference tensor: like any module's, this call needs inference mode (or no_grad) too.
    with torch.inference_mode():
        if DEVICE == "cpu":
            with pytest.raises(standardkernels.CoverageError, match="fused_pre_norm_geglu.*CPU"):
                with standardkernels.coverage.strict():
                    output = block(x)
        else:
            with standardkernels.coverage.strict():
                output = block(x)


def test_training_case_1_from_scratch_and_case_2_from_trained_weights():
    from standardkernels.nn import PreNormGEGLUFFN

    # Case 1
    model = MyModel()
    model.ffn = PreNormGEGLUFFN()
    model = model.to(DEVICE).train()
    assert all(p.device.type == DEVICE for p in model.parameters())

    # Case 2, keeping the original model for comparison
    torch.manual_seed(0)
    checkpoint = MyModel().state_dict()
    reference_model = MyModel()
    reference_model.load_state_dict(checkpoint)
    reference_model = reference_model.to(DEVICE)

    optimized_model = MyModel().to(DEVICE)
    optimized_model.load_state_dict(checkpoint)
    optimized_model.ffn = PreNormGEGLUFFN.from_module(
        optimized_model.ffn
    ).train()
    for name, tensor in checkpoint.items():  # the swapped module holds the checkpoint's exact values
        ours = dict(optimized_model.named_parameters())[
            name.replace("my_norm", "norm").replace("my_gate", "gate").replace("my_up", "up")
            .replace("my_down", "down")]
        assert ours.device.type == DEVICE and torch.equal(ours.cpu(), tensor)

    x = torch.randn(64, 768, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
            want = reference_model(x)
            got = optimized_model(x)
    assert rel_err(got, want) < 2e-2  # two bf16 paths of one function: each within 1e-2 of exact


def test_sample_training_loop_and_autocast():
    from standardkernels.nn import PreNormGEGLUFFN

    torch.manual_seed(0)
    model = MyModel().to(DEVICE)
    model.ffn = PreNormGEGLUFFN.from_module(model.ffn).train()
    inputs = torch.randn(64, 768)
    dataloader = [(inputs, 0.5 * inputs.flip(-1))] * 6  # one batch, seen repeatedly: the loss must fall

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    losses = []
    for x, target in dataloader:
        x = x.to(device=DEVICE, dtype=torch.bfloat16)
        target = target.to(device=DEVICE)

        optimizer.zero_grad(set_to_none=True)

        with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):  # proj_in/out as bf16 like the FFN
            output = model(x)
        loss = torch.nn.functional.mse_loss(
            output.float(),
            target.float(),
        )

        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in model.ffn.parameters())  # FP32 masters, FP32 grads
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses

    # "If you use CUDA BF16 autocast, an FP32 input activation is selectively converted to BF16 for this op"
    x = torch.randn(64, 768, device=DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        output = model.ffn(x)  # x may start as FP32
        loss = torch.nn.functional.mse_loss(output.float(), x.float())
    assert output.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.ffn.parameters())


@pytest.mark.gpu
def test_cuda_graph_inference_verbatim():
    from standardkernels.cuda_graphs import make_graphed_callables
    from standardkernels.nn import PreNormGEGLUFFN

    block = PreNormGEGLUFFN().cuda().eval()
    sample_x = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)

    with torch.inference_mode():
        graphed_block = make_graphed_callables(
            block,
            (sample_x,),
        )

    next_x = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        output = graphed_block(next_x)
    with torch.inference_mode():
        saved_output = graphed_block(next_x).clone()

    with torch.inference_mode():
        assert rel_err(saved_output, block(next_x)) < 1e-3 and output is not saved_output
