"""sk.nn.swap on tiny Hugging Face Llama / Qwen3 / Gemma models built on CPU: what it replaces, what it skips
and why, and that the model's outputs and gradients are unchanged (interpreted kernels and the fallback)."""
import pytest
import torch
from torch import nn

import sk
from numerics import KERNEL_DEVICE, rel_err

transformers = pytest.importorskip("transformers")
from transformers.activations import ACT2FN  # noqa: E402

# fp32 models: swapping changes only the order of fp32 roundings (fp32 statistics either way; HF's Llama norm
# rounds x·rstd before the weight where we round once), so logits agree to ~1e-6 and gradients, after two
# layers' backward through attention and softmax, to a few 1e-6; 1e-5 is numerics.TOLERANCE[fp32].
TOLERANCE = 1e-5
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def tiny(style, device=KERNEL_DEVICE):
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
    }[style]
    torch.manual_seed(0)
    model = model_cls(config_cls(**SMALL)).to(device)
    with torch.no_grad():  # norms away from their initial 1 / 0, so a wrong offset would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def loss_and_grads(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("path", ["kernels", "fallback"])
@pytest.mark.parametrize("style, norms, norm_cls, activation", [
    ("llama", 5, "RMSNorm", "silu"),          # 2 layers x 2 + the final norm
    ("qwen3", 9, "RMSNorm", "silu"),          # + q_norm and k_norm per layer (over head_dim)
    ("gemma", 5, "GemmaRMSNorm", "gelu_tanh"),
])
def test_swap_keeps_outputs_and_gradients(style, norms, norm_cls, activation, path, settings_override):
    device = KERNEL_DEVICE
    if path == "fallback":  # CPU tensors without the interpreter: every op takes its recorded reference
        settings_override(triton_interpret=False)
        device = "cpu"
    elif KERNEL_DEVICE == "cpu" and not sk.settings.get("triton_interpret"):
        pytest.skip("needs the kernels (a GPU or TRITON_INTERPRET=1)")
    model = tiny(style, device)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    logits, grads = loss_and_grads(model, ids)
    keys = model.state_dict().keys()

    replaced = sk.nn.swap(model)
    assert [r.target for r in replaced].count(norm_cls) == norms and len(replaced) == norms + 2
    assert {r.detail.rsplit(", ", 1)[-1] for r in replaced if r.target == "GatedMLP"} == {activation}
    assert replaced.skipped == [] and model.state_dict().keys() == keys
    assert isinstance(model.model.layers[0].mlp, sk.nn.GatedMLP)
    with sk.coverage.strict(path == "kernels"):
        logits_after, grads_after = loss_and_grads(model, ids)
    assert rel_err(logits_after, logits) < TOLERANCE
    assert grads_after.keys() == grads.keys()
    for name, g in grads.items():
        assert rel_err(grads_after[name], g) < TOLERANCE, name
    calls = sk.coverage.report()["kernel_calls"]
    assert (calls.get(f"{'gemma_' if style == 'gemma' else ''}rms_norm", 0) > 0) == (path == "kernels")
    assert sk.nn.swap(model) == []  # a second swap finds nothing left to replace


class OddMLP(nn.Module):  # gate/up/down children but a forward that scales: must not be swapped
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(8, 12), nn.Linear(8, 12), nn.Linear(12, 8)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return 2 * self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class CenteredRMSNorm(nn.Module):  # an "RMSNorm" that subtracts the mean
    def __init__(self):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(8)), 1e-6

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class VisionMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.act_fn = nn.Linear(8, 12), nn.Linear(12, 8), ACT2FN["quick_gelu"]


def test_swap_skips_and_says_why_and_strict_refuses():
    model = nn.ModuleDict({"odd": OddMLP(), "centered": CenteredRMSNorm(), "vision": VisionMLP(),
                           "mlp": transformers.models.llama.modeling_llama.LlamaMLP(
                               transformers.LlamaConfig(hidden_size=8, intermediate_size=12, num_attention_heads=2))})
    with pytest.raises(sk.nn.SwapError, match=r"odd: OddMLP: its forward is not down\(silu\(gate\(x\)\) · up\(x\)\)"):
        sk.nn.swap(model, strict=True)
    assert type(model["mlp"]).__name__ == "LlamaMLP"  # strict: nothing replaced
    result = sk.nn.swap(model)
    assert [(r.name, r.source, r.target) for r in result] == [("mlp", "LlamaMLP", "GatedMLP")]
    reasons = {s.name: s.reason for s in result.skipped}
    assert set(reasons) == {"odd", "centered", "vision"}
    assert "relative error" in reasons["odd"]
    assert "computes neither x·rstd·weight" in reasons["centered"]
    assert "no Linear child 'gate_proj'" in reasons["vision"]
    summary = result.summary()
    assert "replaced 1 module(s), skipped 3" in summary and "skipped vision: VisionMLP" in summary
    assert isinstance(model["odd"], OddMLP) and isinstance(model["centered"], CenteredRMSNorm)
